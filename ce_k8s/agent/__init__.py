"""The ce-k8s agent: watch cache, pod creation, status mapping and the hooks' socket.

Usage (subprocess and in-process) is in docs/agent.md; the entry points are
`ce_k8s.agent.main` (`ce-k8s agent`) and `ce_k8s.agent.agent.Agent`.
"""
