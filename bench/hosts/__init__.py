"""``python -m bench.hosts``: the issue #32 burst on two hosts over a slow, lossy link, beside a clean link.

PostgreSQL runs in one network namespace, the workers in another (bench/netns.py; needs root, ``ip``
and ``nft``). Each round publishes the same burst of versions to a fresh database and lets several worker
processes index it on the real claim / LeaseKeeper heartbeat / fenced publish path with the fake embedder
(tests/network/burst.py); the slow round goes through a relay that adds a delay each way and drops a share of
the link's packets (bench/relay.py: the kernel has no netem). One worker freezes itself past its
lease right after its first claim, so the takeover path runs in every round.

Printed per round: wall time, task statuses, takeovers (and how many no worker reported: must be 0),
publishes that failed and were retried, claim -> publish p50/p95, double publishes (must be 0) and
``kbindex verify``'s result; then the slow round's wall time and p50 as a ratio of the clean round's.
Exit 1 if any task did not end SUCCEEDED, anything was published twice, a takeover went unreported or verify
failed.
"""
