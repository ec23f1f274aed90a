"""sessionstream beside Restate and Temporal on the same workload, one system at a time.

    .venv/bin/python -m bench.peers [--quick] [--json]
        [--systems sessionstream-sdk,sessionstream-http,restate,temporal]

Each system gets 1,000 sessions and the cycle of `_load` (prompt -> accepted, a second
prompt -> rejected `session_busy`, abort -> cancelled, each awaited): closed loop with 16
and 64 cycles in flight, open loop at 100 and 500 commands/s. Per phase: the load average
and each of the system's processes' CPU seconds and RSS from /proc (the load driver, this
process, apart). After the phases, each system's CPU with nothing to do for 10 s (the
driver included: the SDK system's client lives in it). Results: bench/results/peers.json
and peers.md, with ratios to Restate from the same run. Peers are installed on first use,
cached in ~/.cache/sessionstream/peers (`_install`); every process started is stopped.
"""
