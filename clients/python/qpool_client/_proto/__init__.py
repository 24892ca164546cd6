"""The qpool.v1 protobuf and gRPC modules, generated at build time from proto/qpool/v1/qpool.proto
by setup.py (grpc_tools.protoc); not in the source tree."""
