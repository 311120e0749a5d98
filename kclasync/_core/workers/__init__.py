"""Workers: the fleet's registry and liveness.

A worker's entry in ``<app>-WorkerMetricStats`` as the Java KCL 3.x reads it (``worker_metrics``,
and its DynamoDB item: ``worker_metrics_item``) and early failover: noticing a silent worker and
judging its leases early (``worker_silence``). Pure: entries and times in, verdicts out.
"""
