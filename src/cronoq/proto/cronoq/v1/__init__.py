"""cronoq.v1: cronoq.proto and the stubs scripts/gen_proto.py generates from it."""
