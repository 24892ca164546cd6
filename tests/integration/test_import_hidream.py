"""HiDream from diffusers: a tiny HiDreamImagePipeline built here with random weights (no hub):
CLIP-L- and CLIP-G-shaped text encoders with projections, a T5-v1.1-shaped one, a Llama 3 (GQA,
Llama 3 rope scaling) with a byte-level BPE tokenizer.json shaped like Llama 3's, a transformer
with double- and single-stream blocks and the mixture of experts, a FLUX-style VAE and HiDream-I1
Dev's flow-matching scheduler; saved with save_pretrained and imported with
`python -m qpool_export from-diffusers` as kind `hidream`, once from the folder and once with the
Llama given apart (--text-encoder-4), as the published HiDream-I1 folders need.

Without a server (`-k "not served"`): each traced component equals the module it came from
(float32), the manifest says what the server needs (four tokenizers, the static shift), and the
importer's refusals name the problem and leave the repository as it was.

With the server (tests named `served`): the Llama's and T5's token ids against transformers'
tokenizers, the prompt embeddings (T5's states, the stacked Llama states, the pooled CLIPs)
against HiDreamImagePipeline.encode_prompt, and images against HiDreamImagePipeline on the same
weights and initial latents, with and without classifier-free guidance.

Tolerances: float32 on the CPU through the same operations: embeddings within 1e-5, images
within one 8-bit level.
"""

import copy
import os
import shutil
import sys
from pathlib import Path

import pytest

from png_reader import read_png

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
yaml = pytest.importorskip("yaml")
pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")

import test_import_diffusers as sd_tests  # noqa: E402 - after the skips
from conftest import rpc_error  # noqa: E402
from test_import_sdxl import (assert_close, dequantized, one_thread,  # noqa: E402,F401
                              run_import, snapshot)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))
import bpe_reference  # noqa: E402 - Llama 3's tokenizer shape, trained here

EXPORTER = sd_tests.EXPORTER
SIZE = 16  # pixels; the tiny VAE downscales by 2: 8 x 8 latents, 4 x 4 patches
LENGTH = 128  # HiDreamImagePipeline's max_sequence_length, every encoder's tokens
PROMPT = "a red fox in the snow"
PROMPTS = [PROMPT, "", "A photo of an astronaut,  riding a horse! ÉCOLE ﬁ ½ 🦊",
           "a cat " * 80]  # the last one longer than LENGTH tokens
COMPONENTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4",
              "transformer", "vae_decoder")
T5_WIDTH, LLAMA_WIDTH, LLAMA_LAYERS = 24, 32, 3
EOT = "<|eot_id|>"
NF4 = {"transformer": "nf4", "text_encoder_4": "nf4"}


def llama_tokenizer(folder):
    """A PreTrainedTokenizerFast of Llama 3's shape (bpe_reference.py): its regex, ignore_merges,
    <|begin_of_text|> added in front; eos <|eot_id|> and no pad token, as Llama-3.1-Instruct's
    tokenizer_config.json has it."""
    folder.mkdir(parents=True, exist_ok=True)
    bpe_reference.train(bpe_reference.LLAMA3, True, True).save(str(folder / "tokenizer.json"))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token="<|begin_of_text|>",
        eos_token=EOT, model_max_length=131072)


def build_hidream_pipeline(out, tokenizer_files, seed=0):
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler,
                           HiDreamImagePipeline, HiDreamImageTransformer2DModel)
    from transformers import (CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer,
                              LlamaConfig, LlamaForCausalLM, T5Config, T5EncoderModel,
                              T5TokenizerFast)

    torch.manual_seed(seed)
    clip_dir, spiece = tokenizer_files
    t5_dir = out.parent / f"{out.name}-t5"
    t5_dir.mkdir(parents=True)
    shutil.copyfile(spiece, t5_dir / "spiece.model")
    tokenizer_3 = T5TokenizerFast.from_pretrained(str(t5_dir), model_max_length=LENGTH)
    tokenizer_4 = llama_tokenizer(out.parent / f"{out.name}-llama-tokenizer")
    clips = []
    for hidden, pad in ((32, "<|endoftext|>"), (24, "!")):
        tokenizer = CLIPTokenizer(str(clip_dir / "vocab.json"), str(clip_dir / "merges.txt"),
                                  model_max_length=77, pad_token=pad)
        encoder = CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=248,
            projection_dim=16, hidden_act="quick_gelu" if pad != "!" else "gelu",
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id))
        clips.append((tokenizer, encoder))
    text_encoder_3 = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer_3), d_model=T5_WIDTH, d_kv=6, d_ff=40, num_layers=2,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu", dropout_rate=0.0))
    text_encoder_4 = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer_4), hidden_size=LLAMA_WIDTH, intermediate_size=48,
        num_hidden_layers=LLAMA_LAYERS, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        bos_token_id=tokenizer_4.bos_token_id, eos_token_id=tokenizer_4.eos_token_id))
    transformer = HiDreamImageTransformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=2,
        attention_head_dim=16, num_attention_heads=2, caption_channels=[T5_WIDTH, LLAMA_WIDTH],
        text_emb_dim=32, num_routed_experts=4, num_activated_experts=2, axes_dims_rope=[8, 4, 4],
        max_resolution=[16, 16], llama_layers=[0, 2, 1])
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), latent_channels=4,
        norm_num_groups=8, layers_per_block=1, scaling_factor=0.3611, shift_factor=0.1159,
        use_quant_conv=False, use_post_quant_conv=False)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=6.0, use_dynamic_shifting=False)
    pipe = HiDreamImagePipeline(
        scheduler=scheduler, vae=vae, text_encoder=clips[0][1], tokenizer=clips[0][0],
        text_encoder_2=clips[1][1], tokenizer_2=clips[1][0], text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3, text_encoder_4=text_encoder_4, tokenizer_4=tokenizer_4,
        transformer=transformer)
    pipe.save_pretrained(out)
    shutil.copyfile(spiece, out / "tokenizer_3" / "spiece.model")  # as the folders ship it
    return load_pipeline(out)


def load_pipeline(folder):
    """HiDreamImagePipeline scales every request to the area of its default size (128 latent
    pixels a side) and keeps only the aspect ratio asked for; qpool makes the size asked for.
    The reference's default is set to SIZE, where the two agree, so that the tests run at a
    tiny size."""
    from diffusers import HiDreamImagePipeline

    pipe = HiDreamImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    pipe.default_sample_size = SIZE // pipe.vae_scale_factor
    return pipe


@pytest.fixture(scope="module")
def source(tmp_path_factory, tokenizer_files):
    """(diffusers folder, its pipeline)."""
    folder = tmp_path_factory.mktemp("hidream") / "hidream-dev"
    return folder, build_hidream_pipeline(folder, tokenizer_files)


@pytest.fixture(scope="module")
def apart(tmp_path_factory, source):
    """The source as HiDream-I1 publishes it: text_encoder_4 and tokenizer_4 null in
    model_index.json and out of the folder; the Llama (with its tokenizer) in a folder of its
    own. Returns (pipeline folder, Llama folder)."""
    root = tmp_path_factory.mktemp("hidream-apart")
    folder, llama = root / "hidream-dev", root / "llama"
    shutil.copytree(source[0], folder)
    shutil.move(str(folder / "text_encoder_4"), str(llama))
    for name in os.listdir(folder / "tokenizer_4"):
        shutil.move(str(folder / "tokenizer_4" / name), str(llama / name))
    os.rmdir(folder / "tokenizer_4")
    sd_tests.edit_json(folder / "model_index.json", text_encoder_4=[None, None],
                       tokenizer_4=[None, None])
    return folder, llama


@pytest.fixture(scope="module")
def imported(tmp_path_factory, source, apart):
    repository = tmp_path_factory.mktemp("repo")
    folders = {}
    # hidream-apart through the full path, with its check against diffusers (Note [Streaming
    # import]); both serve images equal to diffusers'.
    for name, args in (("hidream-dev", (source[0], "--dtype", "float32")),
                       ("hidream-apart", (apart[0], "--dtype", "float32", "--full-check",
                                          "--text-encoder-4", str(apart[1])))):
        done = run_import(args[0], repository / name, *args[1:])
        assert done.returncode == 0, done.stderr
        assert ("max diff vs diffusers" if "--full-check" in args else "streamed") in done.stdout
        folders[name] = repository / name
    spec = ",".join(f"{c}={f}" for c, f in NF4.items())
    done = run_import(source[0], repository / "hidream-nf4", "--dtype", "float32",
                      "--quantize", spec)
    assert done.returncode == 0, done.stderr
    folders["hidream-nf4"] = repository / "hidream-nf4"
    return folders


# ------------------------------------------------------------------ without a server


def llama_inputs(pipe, prompts):
    out = pipe.tokenizer_4(prompts, padding="max_length", max_length=LENGTH, truncation=True,
                           add_special_tokens=True, return_tensors="pt")
    return out.input_ids, out.attention_mask


def test_traced_components_equal_diffusers(source, imported):
    _, pipe = source
    sys.path.insert(0, str(EXPORTER))
    load = {c: sd_tests.load_component(imported["hidream-dev"] / f"{c}.pt") for c in COMPONENTS}
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for i, (tokenizer, encoder) in enumerate(((pipe.tokenizer, pipe.text_encoder),
                                                  (pipe.tokenizer_2, pipe.text_encoder_2))):
            ids = tokenizer(PROMPTS, padding="max_length", max_length=LENGTH, truncation=True,
                            return_tensors="pt").input_ids
            name = COMPONENTS[i]
            assert_close(load[name](ids), encoder(ids).text_embeds, f"{name}'s text_embeds")
        t5 = pipe.tokenizer_3(PROMPTS, padding="max_length", max_length=LENGTH, truncation=True,
                              return_tensors="pt")
        assert_close(load["text_encoder_3"](t5.input_ids, t5.attention_mask),
                     pipe.text_encoder_3(t5.input_ids, attention_mask=t5.attention_mask)[0],
                     "text_encoder_3")
        ids, mask = llama_inputs(pipe, PROMPTS)
        want = torch.stack(pipe.text_encoder_4(ids, attention_mask=mask,
                                               output_hidden_states=True).hidden_states[1:])
        assert_close(load["text_encoder_4"](ids, mask), want, "text_encoder_4")
        args = (torch.randn(2, 4, 8, 8, generator=gen), torch.rand(2, generator=gen) * 1000,
                torch.randn(2, LENGTH, T5_WIDTH, generator=gen),
                torch.randn(LLAMA_LAYERS, 2, LENGTH, LLAMA_WIDTH, generator=gen),
                torch.randn(2, 32, generator=gen))
        want = pipe.transformer(hidden_states=args[0], timesteps=args[1],
                                encoder_hidden_states_t5=args[2],
                                encoder_hidden_states_llama3=args[3], pooled_embeds=args[4],
                                return_dict=False)[0]
        assert_close(load["transformer"](*args, torch.ones(2, 16)), want, "transformer")
        # Nothing is made on the importing machine's device (the server runs them on GPUs).
        from qpool_export import tracing

        for name in COMPONENTS:
            tracing.check_no_baked_device(name, load[name])
        z = torch.randn(2, 4, 6, 6, generator=gen)
        assert_close(load["vae_decoder"](z), pipe.vae.decode(z).sample, "vae decoder")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_components_run_in_half_precision(imported, dtype):
    """Traced in float32, run in the pipeline's dtype as the server converts them (the frequency
    tables kept in float32): a dtype baked into a graph (float32's minimum in T5's mask, a
    rotation cast back with .to(float32)) fails here, not on the GPU."""
    sys.path.insert(0, str(EXPORTER))
    from qpool_export.import_steps import to_dtype

    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 200, (2, LENGTH), generator=gen)
    mask = torch.ones(2, LENGTH, dtype=torch.long)
    mask[1, 9:] = 0
    image_mask = torch.zeros(2, 12)  # 4 x 2 patches, padded (Note [Padded images])
    image_mask[:, :8] = 1
    floats = (torch.randn(2, 4, 8, 4, generator=gen), torch.rand(2, generator=gen) * 1000,
              torch.randn(2, LENGTH, T5_WIDTH, generator=gen),
              torch.randn(LLAMA_LAYERS, 2, LENGTH, LLAMA_WIDTH, generator=gen),
              torch.randn(2, 32, generator=gen), image_mask)
    cases = {"text_encoder": (ids,), "text_encoder_2": (ids,), "text_encoder_3": (ids, mask),
             "text_encoder_4": (ids, mask), "transformer": floats,
             "vae_decoder": (torch.randn(1, 4, 6, 6, generator=gen),)}
    with torch.no_grad():
        for name, inputs in cases.items():
            path = str(imported["hidream-dev"] / f"{name}.pt")
            want = sd_tests.load_component(path)(*inputs)
            module = sd_tests.load_component(path)
            to_dtype(module, dtype)
            # The server passes timesteps in float32 and everything else in the dtype.
            cast = tuple(t if not t.is_floating_point() or (name == "transformer" and k == 1)
                         else t.to(dtype) for k, t in enumerate(inputs))
            got = module(*cast).float()
            assert torch.isfinite(got).all(), (name, dtype)
            assert (got - want).abs().max() < 0.1 * want.abs().max(), (name, dtype)


def test_manifest_describes_the_hidream_pipeline(imported):
    manifest = yaml.safe_load((imported["hidream-dev"] / "pipeline.yaml").read_text())
    assert manifest["kind"] == "hidream"
    assert list(manifest["components"]) == list(COMPONENTS)
    assert manifest["tokenizer"]["max_length"] == manifest["tokenizer_2"]["max_length"] == LENGTH
    assert manifest["tokenizer_2"]["pad_token"] == "!"
    assert manifest["tokenizer_3"] == {"model": "tokenizer_3/spiece.model", "max_length": LENGTH}
    assert manifest["tokenizer_4"] == {"json": "tokenizer_4/tokenizer.json",
                                       "max_length": LENGTH, "pad_token": EOT}
    assert manifest["conditioning"] == {"padded_image_tokens": 64}  # max_resolution 16 x 16
    assert manifest["scheduler"]["shift"] == 6.0
    assert manifest["scheduler"]["use_dynamic_shifting"] is False
    assert manifest["latent"] == {"channels": 4, "downscale": 2, "scaling_factor": 0.3611,
                                  "shift_factor": 0.1159}
    assert manifest["defaults"] == {"steps": 50, "guidance_scale": 5.0, "width": 256,
                                    "height": 256, "scheduler": "euler"}
    apart = yaml.safe_load((imported["hidream-apart"] / "pipeline.yaml").read_text())
    assert {k: v["file"] for k, v in apart["components"].items()} == {
        k: v["file"] for k, v in manifest["components"].items()}
    assert {k: v for k, v in apart.items() if k != "components"} == {
        k: v for k, v in manifest.items() if k != "components"}


def test_dynamic_shifting_gets_the_pipelines_fixed_mu():
    """HiDreamImagePipeline's mu comes from the transformer's max_seq (calculate_shift with its
    defaults), whatever the image and the scheduler's base and max: the manifest's flat line."""
    sys.path.insert(0, str(EXPORTER))
    from diffusers.pipelines.hidream_image.pipeline_hidream_image import calculate_shift
    from qpool_export import hidream_import

    section = hidream_import.fixed_mu_schedule(
        {"shift": 1.0, "use_dynamic_shifting": True, "base_shift": 0.3, "max_shift": 2.0},
        max_seq=64)
    assert section["base_shift"] == section["max_shift"] == pytest.approx(calculate_shift(64))
    assert hidream_import.fixed_mu_schedule({"use_dynamic_shifting": False}, 64) == {
        "use_dynamic_shifting": False}


edit_json = sd_tests.edit_json

FAILURES = {
    "no text_encoder_4": (
        lambda s: (shutil.rmtree(s / "text_encoder_4"),
                   edit_json(s / "model_index.json", text_encoder_4=[None, None])),
        "text_encoder_4: missing; HiDream folders name their Llama apart: pass "
        "--text-encoder-4 DIR"),
    "UniPC scheduler without flow sigmas": (
        lambda s: edit_json(s / "scheduler" / "scheduler_config.json",
                            _class_name="UniPCMultistepScheduler"),
        "field '_class_name' is 'UniPCMultistepScheduler'; kind hidream imports "
        "FlowMatchEulerDiscreteScheduler, or UniPCMultistepScheduler with use_flow_sigmas"),
    "unknown expert count": (
        lambda s: edit_json(s / "transformer" / "config.json", num_activated_experts=5),
        "transformer/config.json: field 'num_activated_experts' is 5"),
    "a Llama too narrow": (
        lambda s: edit_json(s / "transformer" / "config.json", caption_channels=[T5_WIDTH, 40]),
        "field 'caption_channels[1]' is 40; the text encoders give 32"),
    "tokenizer.json missing": (
        lambda s: os.remove(s / "tokenizer_4" / "tokenizer.json"),
        "tokenizer_4/tokenizer.json: missing"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_import_failures_name_the_problem_and_leave_the_repository_untouched(
        source, imported, tmp_path, case):
    edit, message = FAILURES[case]
    src = sd_tests.broken_copy(source[0], tmp_path, edit)
    repository = tmp_path / "repo"
    shutil.copytree(imported["hidream-dev"], repository / "hidream-dev")
    before = snapshot(repository)
    done = run_import(src, repository / "hidream-dev", "--dtype", "float32")
    assert (done.returncode, "Traceback" in done.stderr) == (1, False), done.stderr
    assert message in done.stderr, done.stderr
    assert snapshot(repository) == before


# ------------------------------------------------------------------ served


@pytest.fixture(scope="module")
def references(source):
    """{served pipeline: the diffusers pipeline its images should equal}."""
    return {"hidream-dev": source[1], "hidream-apart": source[1],
            "hidream-nf4": dequantized(load_pipeline(source[0]), NF4)}


@pytest.fixture(scope="module")
def client(make_server, imported):
    return make_server(pipelines=(), load="all", folders=imported)


def array(tensor, dtype):
    return np.frombuffer(tensor.data, dtype=dtype).reshape(tuple(tensor.shape))


def test_served_hidream_pipelines_are_listed(client):
    for name in ("hidream-dev", "hidream-apart", "hidream-nf4"):
        info = client.pipelines()[name]
        assert info.kind == "hidream"
        assert list(info.schedulers) == ["euler", "unipc"]
        assert info.state == client.pb2.PIPELINE_STATE_LOADED, info
        formats = NF4 if name == "hidream-nf4" else {}
        assert {c.name: c.quantization for c in info.components} == {
            c: formats.get(c, "none") for c in COMPONENTS}


def test_served_refuses_what_the_kind_cannot_make(client):
    """Sides are a multiple of 2x the VAE's downscale; a non-square image's patches fit the
    transformer's max_seq (64 of 4x4 pixels here), to which they are padded."""
    import grpc

    for fields, says in (({"width": 4 * SIZE, "height": 2 * SIZE}, "pads non-square images to 64"),
                         ({"width": SIZE + 2, "height": SIZE + 2}, "multiple of 4")):
        error = rpc_error(client.generate_one, pipeline="hidream-dev", prompt=PROMPT, steps=1,
                          **fields)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert says in error.details(), error.details()


def test_served_embeddings_match_diffusers(client, source):
    _, pipe = source
    reply = client.inference.Encode(
        client.pb2.EncodeRequest(pipeline="hidream-dev", prompts=PROMPTS), timeout=60)
    ids, _ = llama_inputs(pipe, PROMPTS)
    assert np.array_equal(array(reply.llm_input_ids, np.int64), ids.numpy())
    t5_ids = pipe.tokenizer_3(PROMPTS, padding="max_length", max_length=LENGTH,
                              truncation=True, return_tensors="pt").input_ids
    assert np.array_equal(array(reply.input_ids, np.int64), t5_ids.numpy())
    with torch.no_grad():
        t5, _, llama, _, pooled, _ = pipe.encode_prompt(
            prompt=PROMPTS, prompt_2=None, prompt_3=None, prompt_4=None,
            do_classifier_free_guidance=False, max_sequence_length=LENGTH)
    got = array(reply.llm_embeddings, np.float32)
    assert got.shape == tuple(llama.shape)  # [layers, n, tokens, width]
    assert np.abs(got - llama.numpy()).max() < 1e-5
    got_t5 = array(reply.embeddings, np.float32)
    assert got_t5.shape == tuple(t5.shape)
    assert np.abs(got_t5 - t5.numpy()).max() < 1e-5
    got_pooled = array(reply.pooled_embeddings, np.float32)
    assert got_pooled.shape == tuple(pooled.shape)
    assert np.abs(got_pooled - pooled.numpy()).max() < 1e-5


def latents_for(seed, images=1, width=SIZE, height=SIZE):
    """The noise qpool draws for a request with `seed` (image i from a CPU generator seeded with
    seed + i), which HiDreamImagePipeline gets as its initial latents."""
    return torch.cat([torch.randn((1, 4, height // 2, width // 2),
                                  generator=torch.Generator().manual_seed(seed + i))
                      for i in range(images)])


def diffusers_images(pipe, steps, seed, prompt, guidance_scale, images=1, negative_prompt=None,
                     width=SIZE, height=SIZE, scheduler=None):
    """HiDreamImagePipeline's images, 8-bit; width x height must have SIZE x SIZE's area, which
    it keeps (load_pipeline)."""
    assert width * height == SIZE * SIZE
    if scheduler is not None:
        pipe = copy.copy(pipe)  # the fixture's pipeline keeps its own scheduler
        pipe.scheduler = scheduler
    with torch.no_grad():
        out = pipe(prompt=prompt, negative_prompt=negative_prompt, height=height, width=width,
                   num_inference_steps=steps, guidance_scale=guidance_scale,
                   latents=latents_for(seed, images, width, height),
                   num_images_per_prompt=images, max_sequence_length=LENGTH, output_type="np")
    return [np.round(image * 255).astype(np.int16) for image in out.images]


@pytest.mark.parametrize("name, guidance, negative, images, width, height", [
    ("hidream-dev", 0.0, "", 1, SIZE, SIZE),  # HiDream-I1 Dev and Fast: no guidance
    ("hidream-dev", 5.0, "blurry, low quality", 2, SIZE, SIZE),  # Full's CFG, a negative prompt
    ("hidream-apart", 5.0, "", 1, SIZE, SIZE),  # CFG with the empty negative prompt
    ("hidream-nf4", 5.0, "blurry", 1, SIZE, SIZE),  # the NF4 transformer and Llama
    # Non-square: 2 x 8 patches padded to max_seq's 64, their keys masked (Note [Padded images])
    ("hidream-dev", 0.0, "", 1, 2 * SIZE, SIZE // 2),
    ("hidream-dev", 5.0, "", 1, SIZE // 2, 2 * SIZE),
])
def test_served_images_match_diffusers(client, references, name, guidance, negative, images,
                                       width, height):
    pipe = references[name]
    steps, seed = 3, 11
    result = client.generate_one(pipeline=name, prompt=PROMPT, negative_prompt=negative,
                                 steps=steps, guidance_scale=guidance, seed=seed, width=width,
                                 height=height, num_images=images)
    want = diffusers_images(pipe, steps, seed, PROMPT, guidance, images, negative, width, height)
    assert len(result.images) == images
    for image, expected in zip(result.images, want):
        png = read_png(image.png)
        assert (png.width, png.height, png.channels) == (width, height, 3)
        got = np.frombuffer(b"".join(png.rows), dtype=np.uint8).reshape(height, width, 3)
        assert expected.std() > 5, "a flat reference image compares nothing"
        assert np.abs(got.astype(np.int16) - expected).max() <= 1, name


def test_served_unipc_images_match_diffusers(client, references):
    """scheduler unipc: diffusers' UniPCMultistepScheduler on flow sigmas with the pipeline's
    shift as its flow_shift (HiDream-I1 Full's scheduler, Note [Flow-matching UniPC]); 4 steps
    take both orders and the corrector, with CFG."""
    from diffusers import UniPCMultistepScheduler

    pipe = references["hidream-dev"]
    unipc = UniPCMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction",
                                    flow_shift=pipe.scheduler.config.shift)
    steps, seed = 4, 5
    result = client.generate_one(pipeline="hidream-dev", prompt=PROMPT, negative_prompt="blurry",
                                 steps=steps, guidance_scale=5.0, seed=seed, width=SIZE,
                                 height=SIZE, scheduler="unipc")
    want = diffusers_images(pipe, steps, seed, PROMPT, 5.0, 1, "blurry", scheduler=unipc)[0]
    png = read_png(result.images[0].png)
    got = np.frombuffer(b"".join(png.rows), dtype=np.uint8).reshape(SIZE, SIZE, 3)
    assert want.std() > 5, "a flat reference image compares nothing"
    assert np.abs(got.astype(np.int16) - want).max() <= 1
    euler = diffusers_images(pipe, steps, seed, PROMPT, 5.0, 1, "blurry")[0]
    assert np.abs(euler - want).max() > 1, "the two samplers make the same image"
