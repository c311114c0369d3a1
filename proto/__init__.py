"""The v1 contract: generated messages and stubs, and the program codec."""
