"""I/O adapters: the only code that talks to DynamoDB and Kinesis (or their in-memory stand-ins)."""
