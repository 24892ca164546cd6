"""Writes fuzz/corpus/fuzz_component/: TorchScript component files of a few KB, one for each
forward signature the kinds declare (Note [Component signatures]), files the load refuses (a tensor
constant, no forward, a tensor of a dtype qpool does not place, a call of an operator the server
does not have, a forward that returns no tensor), and broken files: truncated, corrupted, not
TorchScript at all.

TorchScript zips hold their code compressed; most seeds are rewritten with every record stored,
as LibTorch reads both, so that mutations reach the pickles and the TorchScript source the load
compiles instead of a deflate stream. Stored copies drop the random serialization id (so the seeds
are the same on every run) and the debug information.

The other files there are inputs the fuzzer found (fuzz/README.md, Findings); they stay.

Usage: .venv/bin/python fuzz/make_component_seeds.py
"""

import io
import pathlib
import struct
import sys
import tempfile
import zipfile
from typing import List, Tuple

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "corpus" / "fuzz_component"
sys.path.insert(0, str(ROOT / "tools" / "qpool_export"))
from qpool_export import tracing  # noqa: E402  (the exporter's trace and constant scan)

HIDDEN = 8
LATENT = 4


class TextEncoder(torch.nn.Module):
    """forward(input_ids) -> hidden states, or (hidden states, pooled) with `pooled`."""

    def __init__(self, pooled: bool = False):
        super().__init__()
        self.embed = torch.nn.Embedding(32, HIDDEN)
        self.register_buffer("position_ids", torch.arange(8).unsqueeze(0))
        self.position = torch.nn.Embedding(8, HIDDEN)
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False) if pooled else None

    def forward(self, input_ids):
        ids = self.position_ids[:, : input_ids.shape[1]]
        hidden = self.norm(self.embed(input_ids) + self.position(ids))
        if self.proj is None:
            return hidden
        return hidden, self.proj(hidden[:, 0])


class Denoiser(torch.nn.Module):
    """A UNet's or a transformer's forward: the latents, a timestep and `extra` more inputs."""

    def __init__(self, extra: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(LATENT, LATENT, 3, padding=1)
        self.register_buffer("freqs", torch.exp(-torch.arange(HIDDEN // 2) / 2.0))
        self.time = torch.nn.Linear(HIDDEN, LATENT)
        self.context = torch.nn.Linear(HIDDEN, LATENT)
        self.extra = extra

    def forward(self, sample, timestep, encoder_hidden_states, *rest):
        angles = timestep.float().reshape(-1, 1) * self.freqs
        emb = self.time(torch.cat([angles.sin(), angles.cos()], dim=1).type_as(sample))
        ctx = self.context(encoder_hidden_states.mean(dim=1))
        out = self.conv(sample) + (emb + ctx)[:, :, None, None]
        for r in rest:
            out = out + r.float().mean() * 0
        return out


class Decoder(torch.nn.Module):
    """forward(latents) -> pixels at twice the size."""

    def __init__(self):
        super().__init__()
        self.conv_in = torch.nn.Conv2d(LATENT, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 8)
        self.conv_out = torch.nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, latents):
        x = torch.nn.functional.silu(self.norm(self.conv_in(latents)))
        x = torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.conv_out(x)


class Inner(torch.nn.Module):
    """Quant-state-named buffers, an int buffer and a plain tensor attribute (Note [qpool owns the
    tensors]); its weight is shared with the outer module."""

    def __init__(self, weight: torch.nn.Parameter):
        super().__init__()
        self.weight = weight
        self.register_buffer("absmax", torch.full((4,), 2.0))
        self.register_buffer("code", torch.linspace(-1, 1, 16))
        self.register_buffer("steps", torch.arange(3, dtype=torch.int64))

    def forward(self, x):
        return torch.matmul(x, self.weight) * self.absmax[0]


class Passthrough(torch.nn.Module):
    """forward(latents) -> latents: a file whose source the nesting seeds replace."""

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return latents


class Scripted(torch.nn.Module):
    """Control flow (if, loop) in the graph, submodules, a tied weight."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(4))
        self.inner = Inner(self.weight)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])

    def forward(self, latents):
        x = latents
        for layer in self.layers:
            x = layer(x)
        if bool(x.sum() > 0):
            x = self.inner(x)
        else:
            x = x * self.inner.steps.size(0)
        return x


class Constant(torch.nn.Module):
    """Traced with a tensor the trace bakes into the graph (Note [No tensor constants])."""

    def forward(self, latents):
        return latents + torch.arange(4.0)


class NoForward(torch.nn.Module):
    """A script module with a method but no forward."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    @torch.jit.export
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return latents * self.weight


class SubByte(torch.nn.Module):
    """A buffer of a dtype the residency has no copy for."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bits", torch.zeros(8, dtype=torch.int1))

    def forward(self, latents):
        return latents


class CallsAGoneOp(torch.nn.Module):
    """Calls an operator that exists while the seeds are written, and nowhere else."""

    def forward(self, latents):
        return torch.ops.qpool_seed_gone.twice(latents)


class TupleOfOne(torch.nn.Module):
    def forward(self, latents: torch.Tensor) -> Tuple[torch.Tensor]:
        return (latents,)


class TensorAndInt(torch.nn.Module):
    def forward(self, latents: torch.Tensor) -> Tuple[torch.Tensor, int]:
        return latents, 1


class ListOfTensors(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor) -> List[torch.Tensor]:
        return [input_ids.float(), input_ids.float()]


def saved(module: torch.jit.ScriptModule, archive: str) -> bytes:
    """The file torch.jit.save writes for `module`, its records under `archive/`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / f"{archive}.pt"
        module.save(str(path))
        return path.read_bytes()


def stored(data: bytes) -> bytes:
    """`data`'s zip with every record stored, without the serialization id and the debug
    information (source ranges for error messages, which the load does not need), a fixed date."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            if info.filename.endswith(("/.data/serialization_id", ".debug_pkl")):
                continue
            dst.writestr(zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0)),
                         src.read(info.filename))
    return out.getvalue()


def with_code(data: bytes, code: str) -> bytes:
    """`data`'s stored zip with its TorchScript source replaced by `code`."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            body = src.read(info.filename)
            if info.filename.endswith("/code/__torch__.py"):
                body = code.encode()
            dst.writestr(zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0)), body)
    return out.getvalue()


def traced(module: torch.nn.Module, *example: torch.Tensor) -> torch.jit.ScriptModule:
    module.eval()
    result = tracing.trace(module, example)
    assert not tracing.tensor_constants(result), type(module).__name__
    return result


def record_offset(data: bytes, suffix: str) -> int:
    """Where the bytes of the record whose name ends with `suffix` start."""
    for info in zipfile.ZipFile(io.BytesIO(data)).infolist():
        if info.filename.endswith(suffix):
            name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:
                                                            info.header_offset + 30])
            return info.header_offset + 30 + name_len + extra_len
    raise KeyError(suffix)


def seeds():
    torch.manual_seed(0)
    ids = torch.randint(0, 32, (1, 8))
    latents = torch.randn(1, LATENT, 4, 4)
    t = torch.tensor([10])
    context = torch.randn(1, 8, HIDDEN)
    # One file per forward signature the kinds declare (pipeline/<kind>/<kind>_kind.cpp).
    text_encoder = traced(TextEncoder(), ids)
    unet = traced(Denoiser(0), latents, t, context)
    vae = traced(Decoder(), latents)
    yield "text_encoder", stored(saved(text_encoder, "text_encoder"))
    yield "text_encoder_2", stored(saved(traced(TextEncoder(pooled=True), ids), "text_encoder_2"))
    yield "unet", stored(saved(unet, "unet"))
    yield "unet_sdxl", stored(saved(
        traced(Denoiser(2), latents, t, context, torch.randn(1, HIDDEN), torch.randn(1, 6)),
        "unet"))
    yield "transformer", stored(saved(
        traced(Denoiser(4), latents, t, context, torch.randn(1, HIDDEN), torch.zeros(16, 3),
               torch.zeros(8, 3), torch.tensor([3.5])), "transformer"))
    yield "vae_decoder", stored(saved(vae, "vae_decoder"))
    yield "vae_decoder_half", stored(saved(traced(Decoder(), latents).half(), "vae_decoder"))
    yield "scripted", stored(saved(torch.jit.script(Scripted()), "vae_decoder"))
    # As torch.jit.save writes them: code compressed, a serialization id.
    yield "text_encoder_as_saved", saved(text_encoder, "text_encoder")
    yield "vae_decoder_as_saved", saved(vae, "vae_decoder")
    # Files the load refuses: a tensor constant; no forward; forwards that return no tensor.
    with tracing.quiet_torchscript(), torch.no_grad():
        constant = torch.jit.trace(Constant(), (torch.zeros(4),), check_trace=False)
    yield "tensor_constant", stored(saved(constant, "vae_decoder"))
    yield "no_forward", stored(saved(torch.jit.script(NoForward()), "vae_decoder"))
    yield "int1_buffer", stored(saved(torch.jit.script(SubByte()), "vae_decoder"))
    gone = torch.library.Library("qpool_seed_gone", "DEF")
    gone.define("twice(Tensor x) -> Tensor")
    gone.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    yield "unknown_op", stored(saved(torch.jit.script(CallsAGoneOp()), "vae_decoder"))
    yield "tuple_of_one", stored(saved(torch.jit.script(TupleOfOne()), "vae_decoder"))
    yield "tensor_and_int", stored(saved(torch.jit.script(TensorAndInt()), "text_encoder_2"))
    yield "list_of_tensors", stored(saved(torch.jit.script(ListOfTensors()), "text_encoder_2"))
    # Not TorchScript: a state dict as torch.save writes it, an empty zip, no zip.
    state = io.BytesIO()
    torch.save(Decoder().state_dict(), state)
    yield "state_dict", stored(state.getvalue())
    yield "empty_zip", b"PK\x05\x06" + bytes(18)
    yield "empty", b""
    yield "text", b"def forward(self, latents):\n    return latents\n"
    # Broken copies of a valid file: truncated, and corrupted where the reader looks first.
    good = stored(saved(vae, "vae_decoder"))
    yield "truncated_half", good[: len(good) // 2]
    yield "truncated_end", good[:-10]
    yield "truncated_header", good[:100]
    bad = bytearray(good)
    bad[record_offset(good, "/data.pkl") + 1] ^= 0x01  # the pickle protocol byte
    yield "bad_pickle_protocol", bytes(bad)
    bad = bytearray(good)
    bad[record_offset(good, "/version")] = ord("0")
    yield "bad_version", bytes(bad)
    bad = bytearray(good)
    eocd = good.rfind(b"PK\x05\x06")
    bad[eocd + 16: eocd + 20] = struct.pack("<I", len(good) * 2)  # central directory offset
    yield "bad_directory_offset", bytes(bad)
    bad = bytearray(good)
    code = record_offset(good, "/code/__torch__.py")
    bad[code: code + 3] = b"%%%"
    yield "bad_code", bytes(bad)
    # Source that nests deeper than the compiler's recursion can take (Note [Script source
    # limits]): 20,000 parentheses overflowed its stack; and one just inside the bounds.
    scripted = stored(saved(torch.jit.script(Passthrough()), "vae_decoder"))
    head = "class Passthrough(Module):\n  def forward(self, latents: Tensor) -> Tensor:\n    return "
    yield "deep_parentheses", with_code(scripted, head + "(" * 20000 + "latents" + ")" * 20000)
    yield "deep_operators", with_code(scripted, head + "latents" + " + latents" * 5000)
    yield "nested_inside_bounds", with_code(scripted, head + "(" * 150 + "latents" + ")" * 150)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    total = 0
    count = 0
    for name, data in seeds():
        assert len(data) < 64 * 1024, (name, len(data))
        (OUT / f"{name}.pt").write_bytes(data)
        total += len(data)
        count += 1
    print(f"{count} seeds, {total} bytes in {OUT} (and the inputs kept from findings)")


if __name__ == "__main__":
    main()
