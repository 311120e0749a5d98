"""Records: reading a shard.

KPL de-aggregation and sub-sequence positions (``kpl``), the pause before a shard's next
GetRecords (``read_pacing``), how many reads a worker lets run at once while its renewals run late
(``read_admission``) and what an enhanced fan-out reader does when a subscription ends
(``fanout_session``). Pure: no I/O, no clock, no sleeping.
"""
