"""The hook protocol's wire format, byte for byte (docs/hook-protocol.md §2.1, §2.2, §2.4, §7)."""

from __future__ import annotations

import classad2
import pytest

from ce_k8s.condor import wire

SOURCE_AD_TEXT = """ClusterId = 4711
Cmd = "glidein_startup.sh"
JobStatus = 1
JobUniverse = 5
Owner = "cmspilot"
ProcId = 0
RequestCpus = 8
x509userproxy = "/var/lib/condor-ce/spool/4711/0/cluster4711.proc0.subproc0/x509up"
"""


def _ad(text: str) -> classad2.ClassAd:
    return classad2.parseOne(text, classad2.ParserType.Old)


def test_translate_stdin_matches_reference_example_section_2_2():
    """hook-protocol.md §2.2: route line without its own newline, six dashes, then the sorted source ad."""
    line = wire.route_info_line("K8s", 9, "batch k8s")
    expected = '[ Name = "K8s"; GridResource = "batch k8s"; TargetUniverse = 9 ]\n------\n' + SOURCE_AD_TEXT
    assert wire.translate_stdin(line, _ad(SOURCE_AD_TEXT)) == expected.encode()


def test_route_info_line_omits_empty_grid_resource_section_2_2():
    assert wire.route_info_line("Condor_Pool", 5, "") == '[ Name = "Condor_Pool"; TargetUniverse = 5 ]'
    assert wire.route_info_line("Condor_Pool", 5, None) == '[ Name = "Condor_Pool"; TargetUniverse = 5 ]'


def test_finalize_stdin_has_empty_line_before_dashes_section_2_4():
    src = _ad("B = 2\nA = 1\n")
    dest = _ad("D = 4\nC = 3\n")
    assert wire.finalize_stdin(src, dest) == b"A = 1\nB = 2\n\n------\nC = 3\nD = 4\n"


def test_sprint_ad_sorts_by_byte_order_section_2_2():
    """std::less<std::string>: upper case, then '_', then lower case."""
    ad = _ad("beta = 1\nZed = 2\n_x = 3\nAlpha = 4\napple = 5\n")
    names = [line.split(" = ")[0] for line in wire.sprint_ad(ad).splitlines()]
    assert names == ["Alpha", "Zed", "_x", "apple", "beta"]


@pytest.mark.parametrize(
    "name", ["Capability", "ChildClaimIds", "ClaimId", "claimidlist", "CLAIMIDS", "TransferKey", "_condor_privFoo",
             "_CONDOR_PRIV_x"],
)
def test_sprint_ad_drops_private_attributes_section_2_2(name):
    ad = _ad(f'{name} = "secret"\nKeep = 1\n')
    assert wire.sprint_ad(ad) == "Keep = 1\n"


def test_sprint_ad_values_in_old_syntax_section_2_2():
    """Only '"' is escaped; reals keep '.0'; =?= / =!= are kept; lists and nested ads as printed."""
    ad = classad2.ClassAd()
    ad["S"] = 'a"b\\c'
    ad["R"] = 3.0
    ad["H"] = 1.5
    ad["L"] = [1, "two"]
    ad["N"] = {"a": 1, "b": 2}
    ad["E"] = classad2.ExprTree('x =?= 3 && y =!= "z"')
    assert wire.sprint_ad(ad) == (
        'E = x =?= 3 && y =!= "z"\nH = 1.5\nL = { 1,"two" }\nN = [ a = 1; b = 2 ]\nR = 3.0\nS = "a\\"b\\c"\n'
    )


def test_sprint_ad_writes_embedded_newline_raw_section_2_2():
    """The router breaks the line structure with a raw newline; so do we, faithfully."""
    ad = classad2.ClassAd()
    ad["S"] = "a\nb"
    assert wire.sprint_ad(ad) == 'S = "a\nb"\n'


def test_parse_hook_output_router_rules_section_2_1():
    ad = wire.parse_hook_output('  A = 1\n\n   \nB   =   "x"\nC = a =?= b\nD = 3 trailing words\n')
    assert ad.eval("A") == 1
    assert ad.eval("B") == "x"
    assert wire.unparse_old(ad.lookup("C")) == "a =?= b"
    # ParseExpression without the full-buffer check ignores what follows a complete expression.
    assert ad.eval("D") == 3


@pytest.mark.parametrize(
    "line, why",
    [
        ("JustText", "no '='"),
        ("= 3", "no attribute name"),
        ("'quoted' = 1", "quoted"),
        ("A = ", "does not parse"),
        ("A = foo(", "does not parse"),
        ('A = "unterminated', "does not parse"),
        ("[", "no '='"),
        ("# a comment", "no '='"),
    ],
)
def test_parse_hook_output_refuses_what_the_router_refuses_section_2_1(line, why):
    with pytest.raises(wire.HookOutputError) as info:
        wire.parse_hook_output("Good = 1\n" + line + "\n")
    assert why in str(info.value)
    assert info.value.line_no == 2


def test_old_backslashes_are_literal_section_2_2():
    ad = wire.parse_hook_output('P = "C:\\new\\table"\n')
    assert ad.eval("P") == "C:\\new\\table"


def test_parse_old_ads_separators_section_5():
    text = (
        "-- Schedd: ce.example.org\nClusterId = 1\nProcId = 0\n\n...\n"
        "ClusterId = 2\nProcId = 1\n***\nClusterId = 3\n"
    )
    ads = wire.parse_old_ads(text)
    assert [a.eval("ClusterId") for a in ads] == [1, 2, 3]


def test_parse_old_ads_error_names_source_and_line():
    with pytest.raises(wire.AdParseError) as info:
        wire.parse_old_ads("A = 1\nB = (\n", source="pilot.ad")
    assert str(info.value).startswith("pilot.ad:2: ")


def test_parse_json_ads_keeps_expressions():
    ads = wire.parse_job_ads('[{"ClusterId": 7, "ProcId": 0, "Req": "\\/Expr(RequestCpus > 1)\\/", "Path": "/a/b"}]')
    assert len(ads) == 1
    assert wire.unparse_old(ads[0].lookup("Req")) == "RequestCpus > 1"
    assert ads[0].eval("Path") == "/a/b"


def test_parse_job_ads_refuses_oversized_input():
    with pytest.raises(wire.AdParseError, match="limit"):
        wire.parse_job_ads("A = 1\n" * (wire.MAX_AD_BYTES // 6 + 10))


def test_evaluate_ad_gives_plain_python():
    ad = _ad('A = [x = 1; y = "s"]\nB = {1, "a", [z = 2]}\nC = A.x + 1\nD = undefined\nE = error\nF = 2.5\n')
    assert wire.evaluate_ad(ad) == {"A": {"x": 1, "y": "s"}, "B": [1, "a", {"z": 2}], "C": 2, "D": None,
                                    "E": None, "F": 2.5}


def test_to_json_dict_sorted_and_without_private():
    ad = _ad('B = 1\nClaimId = "s"\nA = x + 1\n')
    assert wire.to_json_dict(ad) == {"A": "/Expr(x + 1)/", "B": 1}
