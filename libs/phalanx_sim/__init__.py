"""``phalanx sim``: a what-if run of the scheduler in virtual time (docs/whatif.md).

No NATS, no API server, deterministic: the same cluster, workload, trace and queues give the
same output. The decisions are the placement engine's (``phalanx_engine.decide``), the order
and fairness rules gang-coordinator's and placement's (``phalanx_rules.fairness``,
``phalanx_rules.queueorder``), the fair share ``phalanx_rules.queues``'.

* ``model`` — what a run takes: gangs with arrival and duration, the settings;
* ``cluster`` — a cluster file or ``--synthetic`` spec as node views;
* ``workload`` — the YAML users submit (Pods, Jobs, JobSets, MPIJobs) with arrival/duration annotations;
* ``trace`` — the Alibaba GPU trace (also what ``bench/packing.py`` replays);
* ``loop`` — the virtual-time run; ``report`` — its figures; ``plots`` — its figures drawn.
"""
