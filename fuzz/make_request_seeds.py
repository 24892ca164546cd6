"""Writes fuzz/corpus/fuzz_requests/: serialized request messages of proto/qpool/v1/qpool.proto,
valid ones as the CLI and the tests send them and near-valid ones the server must refuse.

Usage: .venv/bin/python fuzz/make_request_seeds.py   (needs grpcio-tools, as scripts/setup.sh
installs it)
"""

import importlib
import pathlib
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "corpus" / "fuzz_requests"


def load_messages():
    gen = tempfile.mkdtemp(prefix="qpool-proto-")
    proto = ROOT / "proto"
    rc = protoc.main(["protoc", f"--proto_path={proto}", f"--python_out={gen}",
                      str(proto / "qpool" / "v1" / "qpool.proto")])
    if rc != 0:
        sys.exit(f"protoc failed ({rc})")
    sys.path.insert(0, gen)
    return importlib.import_module("qpool.v1.qpool_pb2")


def seeds(pb):
    yield "generate_minimal", pb.GenerateRequest(pipeline="tiny", prompt="a red apple")
    yield "generate_full", pb.GenerateRequest(
        pipeline="tiny", prompt="a photo of an astronaut riding a horse on mars",
        negative_prompt="blurry, low quality", steps=4, guidance_scale=7.5, width=64, height=64,
        num_images=2, seed=42, scheduler="euler")
    yield "generate_sdxl", pb.GenerateRequest(
        pipeline="sdxl", prompt="a lighthouse at dusk", width=1024, height=1024,
        original_width=2048, original_height=2048, target_width=1024, target_height=1024,
        crop_top=16, crop_left=32)
    yield "generate_flux", pb.GenerateRequest(
        pipeline="flux", prompt="a cat", negative_prompt="a dog", guidance_scale=3.5,
        true_cfg_scale=4.0, width=1024, height=768, steps=28)
    yield "generate_out_of_range", pb.GenerateRequest(
        pipeline="../etc", prompt="x", steps=0, guidance_scale=float("nan"), width=63,
        height=4294967295, num_images=100, scheduler="plms", crop_top=16385)
    yield "generate_unicode", pb.GenerateRequest(
        pipeline="tiny", prompt="東京タワー 🍎 café", negative_prompt="\u00a0\u2003")
    yield "encode", pb.EncodeRequest(pipeline="tiny", prompts=["a red apple", "", "a green pear"])
    yield "encode_empty", pb.EncodeRequest(pipeline="tiny")
    yield "list", pb.ListPipelinesRequest()
    yield "load", pb.LoadPipelineRequest(name="tiny", device="cuda:0")
    yield "load_bad_name", pb.LoadPipelineRequest(name=".hidden\x01name" + "x" * 70)
    yield "unload", pb.UnloadPipelineRequest(name="tiny")
    yield "memory_report", pb.GetMemoryReportRequest(max_events=100000)
    yield "watch_memory", pb.WatchMemoryRequest(after_sequence=12345)
    yield "offload", pb.OffloadPipelineRequest(name="tiny")
    yield "onload", pb.OnloadPipelineRequest(name="tiny", device="cuda:1")
    yield "move", pb.MovePipelineRequest(name="tiny", device="cpu")
    yield "policy_idle", pb.SetOffloadPolicyRequest(
        name="tiny", policy=pb.OffloadPolicy(policy="idle", idle_seconds=300))
    yield "policy_sequential", pb.SetOffloadPolicyRequest(
        name="tiny", policy=pb.OffloadPolicy(policy="sequential", group_mib=64, prefetch=2,
                                             resident_mib=256))
    yield "policy_bad", pb.SetOffloadPolicyRequest(
        name="tiny", policy=pb.OffloadPolicy(policy="idle", idle_seconds=-1))
    yield "empty_cache", pb.EmptyCacheRequest(device="cuda:0")
    yield "allocator_snapshot", pb.GetAllocatorSnapshotRequest()


def main():
    pb = load_messages()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, message in seeds(pb):
        (OUT / f"{name}.bin").write_bytes(message.SerializeToString())
    # Bytes no client would send: an unknown field, a truncated message, invalid UTF-8 in a string.
    (OUT / "unknown_field.bin").write_bytes(
        pb.GenerateRequest(pipeline="tiny").SerializeToString() + b"\xa0\x06\x01")
    (OUT / "truncated.bin").write_bytes(
        pb.GenerateRequest(pipeline="tiny", prompt="a red apple").SerializeToString()[:-3])
    (OUT / "invalid_utf8.bin").write_bytes(b"\x0a\x04tiny\x12\x03\xff\xfe\xfd")


if __name__ == "__main__":
    main()
