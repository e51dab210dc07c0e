"""``polltuned bench``: tune this host's real knobs on the embedded netns + veth world.

The package, one module per part (each imports only those above it in this list)::

    cpu         steal, other processes' CPU, wait for a quiet machine (own CPU: metrics/cpu_scope)
    signals     Ctrl-C / SIGTERM unwind as KeyboardInterrupt; the per-window checkpoint
    world       the netns + veth world and its workloads (sockperf layouts, nginx, memcached)
    env         BenchEnv: the TrialEnv wrapper that adds steal / foreign CPU and records windows
    comparison  the interleaved final comparison, its stopping rule and the per-arm summaries
    table       BenchResult, its JSON document and the printed table
    session     settings, crash recovery, the world + policy + probe + env set up and torn down
    run         run_bench: tuning, then the comparison (the orchestration)

The statistics (geometric means, log-scale CIs, paired ratios) are polltuned.stats.

Workloads (polltuned/bench/world.py): sockperf ping-pong layouts (single, parallel, shared-cpu,
cpu-hog; a fresh sockperf server per window) and real applications started once per run (nginx +
a fresh ``wrk --latency`` per window; memcached + a fresh ``polltuned.host.kvclient`` per window),
measured through the ``command`` probe of their policies (bench-nginx, bench-memcached).

Order of operations (each step undone in ``finally``, also on SIGINT/SIGTERM; :func:`bench_session`):

1. journal + actuator on the real host; if a crashed run left the journal dirty, roll it back first;
2. world: remove a crashed run's leftovers (``ptb-*`` namespaces and what runs in them, the
   application directory), create the namespaces, the veth pair with NAPI active, the workload's
   CPU hog if any, and its application server if any;
3. the workload's policy resolved to the world's nic (``ptb-s/ptbs``), knobs this host lacks dropped,
   the probe pointed at the world with the workload's layout;
4. the engine (``engine.driver.drive``) over a HostEnv whose CPU is the daemon's CPU scope (idle
   polling included; wrapped to add foreign CPU and steal, and to record windows);
5. final comparison, interleaved round by round in a rotating order: the kernel defaults (the host's
   values at start), tuned's static network-latency values (busy_read = busy_poll = 50), the
   configuration polltuned deployed and, with ``--oracle``, the oracle's best (benchmarks/oracle.py);
   at least ``--rounds`` rounds, more until every arm's J has a 95 % CI within ±15 %, at most
   ``--max-rounds``; J per arm as a geometric mean with a log-scale CI, and paired per-round
   ratios to the default (polltuned.bench.comparison);
6. actuator.rollback() (every knob back), servers stopped, world.teardown(), and a check that every
   knob reads back its original value.
"""

