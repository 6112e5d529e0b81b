"""The bed's fixed ports (ce_k8s.real.condor.ports), judged by this machine's kernel.

What made the CI run at defdfa4 fail: a connection that took a bed's port as its local port keeps
a daemon from binding it, SO_REUSEADDR or not, while open and through its TIME_WAIT; what the bed
does about it: reserves the port (the kernel's own answer, shown in a network namespace the test
makes, where the test may narrow the ephemeral range) and waits for the connections made before.
The whole bed, with a connection on its port, is in test_condor_reaper.py.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from polling import wait_for

from ce_k8s.real.condor import ports
from ce_k8s.real.condor.condorlayout import RealCondorError
from ce_k8s.real.processes import alive


def _client_on_own_port() -> tuple[socket.socket, socket.socket, socket.socket, int]:
    """A loopback connection whose client end holds a port, as an ephemeral one would."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.socket()
    client.bind(("127.0.0.1", 0))
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    return listener, server, client, client.getsockname()[1]


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0): no TIME_WAIT left behind."""
    if sock.fileno() == -1:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_a_connection_on_the_port_keeps_a_daemon_from_binding_it_until_its_time_wait_ends():
    listener, server, client, port = _client_on_own_port()
    try:
        assert not ports._bindable(port)                 # open: EADDRINUSE despite SO_REUSEADDR
        client.close()                                   # the client closes first: its end waits 60 s
        server.close()
        states = {u.state for u in ports.uses(port)}
        assert "TIME_WAIT" in states or "FIN_WAIT2" in states, states
        assert not ports._bindable(port)                 # still refused
    finally:
        listener.close()


def test_the_kernel_gives_no_reserved_port_to_a_connection():
    """In a network namespace of the test's own: an ephemeral range of two ports, one reserved; the
    first connection gets the other, the second finds none (EADDRNOTAVAIL)."""
    script = textwrap.dedent("""
        import errno, socket, subprocess
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        open("/proc/sys/net/ipv4/ip_local_port_range", "w").write("40000 40001\\n")
        open("/proc/sys/net/ipv4/ip_local_reserved_ports", "w").write("40000\\n")
        listener = socket.socket(); listener.bind(("127.0.0.1", 50000)); listener.listen()
        first = socket.socket(); first.connect(("127.0.0.1", 50000))
        second = socket.socket()
        try:
            second.connect(("127.0.0.1", 50000)); print(first.getsockname()[1], second.getsockname()[1])
        except OSError as exc:
            print(first.getsockname()[1], errno.errorcode[exc.errno])
        """)
    out = subprocess.run(["unshare", "--net", sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["40001", "EADDRNOTAVAIL"]


def test_the_bed_waits_for_a_connection_made_before_and_refuses_a_listener():
    """(Another bed's listener, named as such, is in test_condor_reaper.py.)"""
    listener, server, client, port = _client_on_own_port()
    said: list[str] = []
    waiting = threading.Event()
    result: list[BaseException | None] = []

    def progress(msg: str) -> None:
        said.append(msg)
        waiting.set()

    def wait() -> None:
        try:
            ports.wait_free(port, progress=progress, timeout=120)
            result.append(None)
        except BaseException as exc:        # handed to the test's thread
            result.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        assert waiting.wait(30), "wait_free said nothing while the port was taken"
        assert "taken by 1 connection(s) made before" in said[0]
        assert not result
        _reset(client)
        _reset(server)
        thread.join(30)
        assert result == [None] and said[-1] == f"127.0.0.1:{port} is free"
    finally:
        _reset(client)
        listener.close()
        thread.join(30)
    with socket.socket() as server_of_its_own:   # given the port by a bind to port 0, say; not a bed
        server_of_its_own.bind(("127.0.0.1", port))
        server_of_its_own.listen()
        refused = rf"listened on by pid {os.getpid()} \(.*\)\), which a bed needs: .* before any bed reserved it"
        with pytest.raises(RealCondorError, match=refused):
            ports.refuse_listeners([port])
        with pytest.raises(RealCondorError, match=refused):
            ports.wait_free(port, progress=said.append, timeout=60)
    ports.refuse_listeners([port])
    ports.wait_free(port, progress=said.append, timeout=0)


def test_past_its_time_the_error_names_the_connection_and_its_process():
    listener, server, client, port = _client_on_own_port()
    try:
        with pytest.raises(RealCondorError) as err:
            ports.wait_free(port, progress=lambda m: None, timeout=0)
        text = str(err.value)
        assert f"127.0.0.1:{port} is still taken" in text
        assert f"ESTABLISHED 127.0.0.1:{port} -> 127.0.0.1:{listener.getsockname()[1]}" in text
        assert f"pid {os.getpid()} (" in text
        assert "net.ipv4.ip_local_reserved_ports" in text
    finally:
        for sock in (client, server):
            _reset(sock)
        listener.close()


@pytest.mark.parametrize(("host", "added", "value"), [
    ("", (19618,), "19618"),
    ("8080,19000-19700", (19618, 9619), "8080,19000-19700,9619"),
    ("9619", (19618, 9619, 19643), "9619,19618,19643"),
])
def test_the_reservation_adds_the_bed_ports_to_the_host_own(host, added, value):
    assert ports.with_ports(host, added) == value


@pytest.fixture
def proc(tmp_path) -> Path:
    path = tmp_path / "proc-sys" / "net" / "ipv4" / "ip_local_reserved_ports"
    path.parent.mkdir(parents=True)
    path.write_text("8080\n")
    return tmp_path / "proc-sys"


def test_the_last_bed_down_gives_the_host_value_back(proc, tmp_path):
    ledger = tmp_path / "ledger.json"
    first, second = (str(tmp_path / n / "state.json") for n in ("a", "b"))
    for holder in (first, second):
        Path(holder).parent.mkdir()
        Path(holder).touch()
    assert ports.reserve(first, (19618,), ledger, proc) == "8080"
    assert ports.reserve(second, (19618, 9619), ledger, proc) == "8080"
    assert ports.reserved(proc) == "8080,19618,9619"
    assert ports.release(first, "8080", ledger, proc) == [second]
    assert ports.reserved(proc) == "8080,19618,9619"
    assert json.loads(ledger.read_text())["saved"] == {ports.RESERVED: "8080"}
    assert ports.release(second, "8080", ledger, proc) == []
    assert ports.reserved(proc) == "8080" and not ledger.exists()


def test_a_kube_bed_never_listens_on_a_condor_bed_port():
    """The kube bed's components take ports by a bind to port 0 before any condor bed reserves its
    own. In a network namespace whose range is 9618-9622, the kernel's `bind` to port 0 gives the
    ports of the other parity than the range's start (9619, 9621; its `connect` takes 9618, 9620,
    9622); `free_port` gives 9621 only."""
    script = textwrap.dedent("""
        import socket, subprocess
        from ce_k8s.real.kube.kubenodes import free_port
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        open("/proc/sys/net/ipv4/ip_local_port_range", "w").write("9618 9622\\n")
        def kernel():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]
        print(sorted({kernel() for _ in range(64)}), sorted({free_port() for _ in range(64)}))
        """)
    out = subprocess.run(["unshare", "--net", sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[9619, 9621] [9621]"


def test_the_kube_bed_knows_every_condor_bed_port():
    from ce_k8s.real.condor.condor import RealCondor
    from ce_k8s.real.condor.stockce import StockCE
    from ce_k8s.real.kube.kubenodes import CONDOR_BED_PORTS

    assert CONDOR_BED_PORTS == set(RealCondor.fixed_ports) | set(StockCE.fixed_ports)


def test_beds_reserving_at_once_lose_no_port(proc, tmp_path):
    """Twelve processes reserve a port each at once: each one's read and write of the sysctl is
    under the ledger's lock, so none writes over another's port."""
    ledger = tmp_path / "ledger.json"
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from ce_k8s.real.condor import ports
        Path(sys.argv[1]).parent.mkdir()
        Path(sys.argv[1]).touch()
        ports.reserve(sys.argv[1], [int(sys.argv[2])], Path({str(ledger)!r}), Path({str(proc)!r}))
        """)
    wanted = [str(20000 + i) for i in range(12)]
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"bed{i}" / "state.json"), port])
             for i, port in enumerate(wanted)]
    assert [p.wait() for p in procs] == [0] * 12
    got = ports.reserved(proc).split(",")
    assert got[0] == "8080" and sorted(got[1:]) == wanted
    assert len(ports.holders(ledger, proc)) == 12


def _unreserved_port() -> int:
    """A port no reservation covers: the kernel's `bind` to port 0 never gives a reserved one."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_hold_is_given_back_by_its_owner_or_by_its_reaper_when_the_owner_is_killed(tmp_path):
    """The test run's hold (tests/conftest.py) on the real sysctl, with a ledger of the test's own:
    its `release` gives the value back and stops its reaper; an owner killed with SIGKILL (no
    teardown) leaves it to the reaper, which gives the value back and removes the hold's file."""
    ledger = tmp_path / "ledger.json"
    before = ports.reserved()
    port = _unreserved_port()
    hold = ports.PortHold(tmp_path / "hold.json", ledger)
    hold.hold([port], owner_pid=os.getpid())
    reaper = json.loads(hold.state.read_text())["reaper_pid"]
    assert str(port) in ports.reserved().split(",") and ports.holders(ledger) == [str(hold.state)]
    assert hold.release() == []
    assert ports.reserved() == before and not ledger.exists() and not hold.state.exists()
    assert not alive(reaper)

    port = _unreserved_port()
    state = tmp_path / "killed.json"
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from ce_k8s.real.condor.ports import PortHold
        PortHold(Path({str(state)!r}), Path({str(ledger)!r})).hold([{port}], owner_pid=os.getpid())
        print("held", flush=True)
        time.sleep(3600)
        """)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3])
    try:
        assert owner.stdout.readline().strip() == "held"
        assert str(port) in ports.reserved().split(",")
        owner.kill()
        owner.wait()
        wait_for(lambda: not state.exists() and not ledger.exists(), timeout=60, interval=0.2,
                 what="the reaper to release the killed owner's hold")
        assert ports.reserved() == before
    finally:
        owner.kill()
        owner.wait()
        ports.PortHold(state, ledger).release()


def test_a_hold_that_fails_to_start_leaves_nothing(tmp_path):
    """The sysctl cannot be read (a /proc/sys without it): the error stands, and neither the hold's
    state file nor a ledger is left behind (the hold's file lives in /run in a test run)."""
    hold = ports.PortHold(tmp_path / "hold.json", tmp_path / "ledger.json", proc=tmp_path / "no-proc-sys")
    with pytest.raises(FileNotFoundError):
        hold.hold([19618], owner_pid=os.getpid())
    assert not hold.state.exists() and not (tmp_path / "ledger.json").exists()


def test_this_run_holds_the_beds_ports_from_its_start():
    """tests/conftest.py: a run that reaches tests/real holds every condor bed's port for its whole
    life, by a hold file in /run (as root, which the real tests need and CI is)."""
    from ce_k8s.real.condor.stockce import StockCE

    if os.geteuid() != 0:
        pytest.fail("the real tests need root (CI runs as root)")
    runs = [h for h in ports.holders() if Path(h).name.startswith("ce-k8s-test-run-ports-")]
    assert runs and all(Path(h).exists() for h in runs), ports.holders()
    assert {str(p) for p in StockCE.fixed_ports} <= set(ports.reserved().split(","))
