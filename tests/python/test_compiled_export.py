"""The exporter's --compile options (Note [Compiled forward]); the compile itself is exercised at
build time (test-models/tiny-compiled) and by the unit and integration tests."""

import pytest

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
