"""The rulebook: Phalanx's scheduling policy, written once, pure.

The services read their caches and call these rules; ``phalanx sim`` reads its own books and
calls the same ones, so the simulator decides as the scheduler does by construction
(docs/architecture.md, "One rulebook"). Nothing here does I/O, keeps state between calls or
reads a clock: every rule takes values and returns values.

==============  ==========================================================================
``queues``      the queue tree, fair shares, limits, what each queue holds (units)
``usage``       each queue's recent usage, decayed by a half-life, and the weight it gives
                its part of the GPUs beyond the quotas (the fair share that remembers)
``queueorder``  a scheduling cycle's queue rules: which queue a pod is in, limit refusals,
                borrowing, the queues owed free GPUs, the cycle's order
``fairness``    which waiting gang starts now (the starvation gate), how long a failed one
                waits, which gangs a release or a cluster change wakes
``preemption``  who may preempt whom and under which rule (a gang younger than its queue's
                minimum runtime is none yet), and whether a set of victims keeps every
                queue's quota and limit
``saga``        the gang saga's transitions: state (+ event, + now) in, new state out
``reserve``     a queue's spare capacity per domain for its repairs: which nodes other
                queues' new work leaves alone
==============  ==========================================================================

import-linter keeps it below the engine and the services: it imports the wire contract
(``phalanx_proto``) and the Kubernetes-object readers (``phalanx_kubeobjects``) only.
"""
