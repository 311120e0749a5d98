"""A MultiLang record processor (amazon_kclpy, version 3 interface): one process per shard,
started by the MultiLangDaemon or by ``kclasync multilang app.properties``."""

import json

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor


def save(order: dict) -> None:
    print(order["id"], order["total"], flush=True)  # your work here


class OrdersProcessor(processor.RecordProcessorBase):
    def initialize(self, initialize_input):
        self.shard_id = initialize_input.shard_id

    def process_records(self, process_records_input):
        for record in process_records_input.records:
            save(json.loads(record.binary_data))
        process_records_input.checkpointer.checkpoint()

    def lease_lost(self, lease_lost_input):
        pass

    def shard_ended(self, shard_ended_input):
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input):
        shutdown_requested_input.checkpointer.checkpoint()


if __name__ == "__main__":
    kcl.KCLProcess(OrdersProcessor()).run()
