"""The exporter's --compile options (Note [Compiled forward]); the compile itself is exercised at
build time (test-models/tiny-compiled) and by the unit and integration tests."""

import zipfile

import pytest
import torch

from qpool_export import compile as aot
from qpool_export.export import parse_args


def test_compile_options_are_parsed(tmp_path):
    opts = parse_args(["--preset", "tiny", "--out", str(tmp_path / "p"), "--compile", "unet"])
    assert opts.compile == ("unet",) and opts.compile_device == "cpu"
    opts = parse_args(["--preset", "tiny", "--out", str(tmp_path / "p"), "--compile", "unet",
                       "--quantize", "nf4"])
    assert opts.compile == ("unet",) and opts.quantize == "nf4"
    opts = parse_args(["--preset", "tiny", "--out", str(tmp_path / "p")])
    assert opts.compile == () and opts.compile_mode == "default"
    opts = parse_args(["--preset", "tiny", "--out", str(tmp_path / "p"), "--compile", "unet",
                       "--compile-mode", "max-autotune"])
    assert opts.compile_mode == "max-autotune"


@pytest.mark.parametrize("args, message", [
    (["--compile", "refiner"], "--compile: unknown component(s) refiner"),
    (["--compile", "unet", "--quantize", "int8", "--quant-mode", "load-time"],
     "--compile with --quantize needs --quant-mode prequantized"),
    (["--compile", "unet", "--compile-device", "tpu"], "invalid choice: 'tpu'"),
    (["--compile", "unet", "--compile-mode", "fast"], "invalid choice: 'fast'"),
])
def test_bad_compile_options_are_refused(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--preset", "tiny", "--out", str(tmp_path / "p")] + args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_signature_and_package_name():
    import torch

    inputs = (torch.zeros(2, 4, 8, 8), torch.zeros(2), torch.zeros(2, 77, 32))
    _, signature = aot._dims("unet", inputs)
    assert signature == ("float32[1:64,4,4:256,4:256];float32[1:64];float32[1:64,77,32]")
    assert aot.package_name("unet", "cuda") == "unet.cuda.pt2"


def test_example_inputs_have_the_dtypes_the_server_passes():
    """The server runs a package only on inputs of the dtypes it was compiled for (Note [Compiled
    forward]). An SDXL UNet gets its sample, text and pooled embeddings in the compute dtype,
    and its timestep and time ids in float32 (SdxlPipeline::RequestInputs builds them so): a
    package compiled with float16 time ids was never run by a GPU server."""
    import torch

    inputs = (torch.zeros(2, 4, 8, 8), torch.zeros(2), torch.zeros(2, 77, 64),
              torch.zeros(2, 32), torch.zeros(2, 6))
    args = aot.example_args("unet", inputs, torch.float16)
    assert [a.dtype for a in args] == [torch.float16, torch.float32, torch.float16, torch.float16,
                                       torch.float32]
    _, signature = aot._dims("unet", args)
    assert signature.split(";")[4] == "float32[1:64,6]"
    # An SD 1.x UNet's three inputs: the timestep alone stays float32.
    args = aot.example_args("unet", inputs[:3], torch.float16)
    assert [a.dtype for a in args] == [torch.float16, torch.float32, torch.float16]
    # FLUX: hidden states, T5 states and pooled CLIP in the compute dtype; the rest float32.
    flux = (torch.zeros(2, 16, 64), torch.zeros(2, 8, 32), torch.zeros(2, 16), torch.zeros(2),
            torch.zeros(16, 3), torch.zeros(8, 3), torch.zeros(2))
    args = aot.example_args("transformer", flux, torch.bfloat16)
    assert [a.dtype for a in args] == [torch.bfloat16] * 3 + [torch.float32] * 4


def test_cuda_needs_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(aot.CompileError, match="needs a GPU"):
        aot.compile_component(torch.nn.Linear(2, 2), "unet", (), "cuda", str(tmp_path / "x"), "")


def test_examples_take_the_serving_side():
    """Note [Compile at the serving size]: the latent side the pipeline serves replaces the
    example's sides (the UNet's rounded up to its down-sampling); batches are at least 2."""
    import torch

    gen = torch.Generator().manual_seed(0)
    decoder = torch.nn.Conv2d(4, 3, 3, padding=1)
    (z,) = aot.resized_examples(decoder, "vae_decoder", (torch.zeros(1, 4, 6, 5),), gen, side=64)
    assert tuple(z.shape) == (2, 4, 64, 64)
    (z,) = aot.resized_examples(decoder, "vae_decoder", (torch.zeros(1, 4, 6, 5),), gen)
    assert tuple(z.shape) == (2, 4, 6, 5)
    unet = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, stride=2, padding=1),
                               torch.nn.Conv2d(4, 4, 3, stride=2, padding=1))
    inputs = (torch.zeros(2, 4, 17, 25), torch.zeros(2), torch.zeros(2, 77, 32))
    sample, t, context = aot.resized_examples(unet, "unet", inputs, gen, side=62)
    assert tuple(sample.shape) == (2, 4, 64, 64)
    assert tuple(t.shape) == (2,) and tuple(context.shape) == (2, 77, 32)


def test_attention_order_moves_the_named_backend_first():
    """Note [Compiled attention]: the order the server runs with --attention NAME."""
    current = [int(b) for b in torch._C._get_sdp_priority_order()]
    assert aot.attention_order("auto", "cpu") == current
    for name, code in (("cudnn", 3), ("flash", 1), ("efficient", 2), ("math", 0)):
        order = aot.attention_order(name, "cpu")
        assert order[0] == code and sorted(order) == sorted(current)
        assert [b for b in order if b != code] == [b for b in current if b != code]
    assert aot.describe_attention([3, 1, 2, 0, 4]) == "cudnn, flash, efficient, math, overrideable"
    with pytest.raises(aot.CompileError, match="--compile-attention fast: choose from auto"):
        aot.attention_order("fast", "cpu")


def test_attention_priority_is_restored():
    before = torch._C._get_sdp_priority_order()
    with pytest.raises(RuntimeError):
        with aot.attention_priority([0, 3, 1, 2, 4]):
            assert torch._C._get_sdp_priority_order() == [0, 3, 1, 2, 4]
            raise RuntimeError("inside")
    assert torch._C._get_sdp_priority_order() == before


def test_the_package_is_compiled_under_the_attention_order(tmp_path, monkeypatch):
    """compile_component exports and compiles under --compile-attention's order and records it in
    the package's metadata; the order outside is left as it was."""
    seen = {}

    def fake_compile(program, package_path, inductor_configs):
        seen["order"] = torch._C._get_sdp_priority_order()
        seen["metadata"] = inductor_configs["aot_inductor.metadata"]
        seen["ops"] = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", fake_compile)
    before = torch._C._get_sdp_priority_order()
    aot.compile_component(torch.nn.Conv2d(4, 3, 1), "vae_decoder", (torch.zeros(2, 4, 8, 8),),
                          "cpu", str(tmp_path / "vae_decoder.cpu.pt2"), "digest",
                          attention="math")
    assert seen["order"] == aot.attention_order("math", "cpu") and seen["order"][0] == 0
    assert seen["metadata"][aot.ATTENTION_KEY] == aot.describe_attention(seen["order"])
    assert seen["metadata"][aot.SOURCE_KEY] == "digest"
    assert any("conv2d" in op for op in seen["ops"])
    assert torch._C._get_sdp_priority_order() == before


class _Attention(torch.nn.Module):
    """Self-attention over 4 heads of 64, the shape every backend takes in float16."""

    def forward(self, x):
        q = x.view(x.shape[0], x.shape[1], 4, 64).transpose(1, 2)
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return out.transpose(1, 2).reshape(x.shape)


_KERNELS = {1: "flash_attention", 2: "efficient_attention", 3: "cudnn_attention"}


@pytest.mark.parametrize("attention", ["auto", "flash", "efficient", "cudnn"])
def test_a_cuda_package_runs_the_attention_kernel_the_server_would(tmp_path, attention):
    """On a GPU: the package's generated code calls the kernel an eager call picks under the
    order the server runs with --attention ATTENTION (Note [Compiled attention])."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    order = aot.attention_order(attention, "cuda")
    q = torch.zeros(2, 16, 256, device="cuda", dtype=torch.float16).view(2, 16, 4, 64)
    q = q.transpose(1, 2)  # as _Attention lays it out
    with aot.attention_priority(order):
        expected = _KERNELS[int(torch.ops.aten._fused_sdp_choice(q, q, q))]
    path = str(tmp_path / "text_encoder.cuda.pt2")
    aot.compile_component(_Attention(), "text_encoder", (torch.randn(2, 16, 256),), "cuda",
                          path, "digest", attention=attention)
    with zipfile.ZipFile(path) as package:
        code = "".join(package.read(n).decode(errors="replace") for n in package.namelist()
                       if n.endswith((".cpp", ".h")))
    assert expected in code
    assert not [k for k in _KERNELS.values() if k != expected and k in code]
