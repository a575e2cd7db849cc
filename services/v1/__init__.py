"""Generated protobuf and gRPC code for rlrun.v1 (`make proto`; never edit by hand)."""
