"""Reconciliation: every service's attempts driven towards what operators asked.

The reconciler (:mod:`.reconciler`) runs one driver per service: it launches and
watches attempts on their nodes (:mod:`.attempts`, :mod:`.liveness`), records what it
observes (:mod:`.observed`), hands a replica from one generation or attempt to the
next (:mod:`.generations`, :mod:`.succession`), wakes and idles on-demand services
(:mod:`.on_demand`) and publishes each service's routing view (:mod:`.publication`).
:mod:`.status` and :mod:`.state_metrics` report what it drove.
"""
