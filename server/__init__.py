"""The partitioning server: registry of hosted partitioners, servicer, blob store, CLI."""
