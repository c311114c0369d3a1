"""Generated code for remote_partitioner.v1. Do not edit: run `make proto`."""
