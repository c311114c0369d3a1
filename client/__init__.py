"""The client: RemotePartitioner, a real ExecuTorch Partitioner backed by the service."""
