"""The importer's checks of a source folder before diffusers or transformers read it: symbolic
links that leave the folder (Note in check_links) and configs that declare absurd sizes (Note
[Config size bounds])."""

import os

import pytest

from qpool_export.diffusers_components import check_config_sizes
from qpool_export.from_diffusers import check_links
from qpool_export.import_error import ImportFailure


def test_a_link_out_of_the_source_folder_is_refused_naming_it(tmp_path):
    src = tmp_path / "pipeline"
    (src / "tokenizer").mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("not a vocabulary")
    (src / "tokenizer" / "vocab.json").symlink_to(secret)
    with pytest.raises(ImportFailure, match="tokenizer/vocab.json: a symbolic link to .*secret"):
        check_links(str(src))
    (src / "tokenizer" / "vocab.json").unlink()
    (src / "tokenizer" / "vocab.json").symlink_to(src / "model_index.json")  # inside: fine
    check_links(str(src))
    (src / "unet").symlink_to(tmp_path, target_is_directory=True)  # a folder out of it
    with pytest.raises(ImportFailure, match="unet: a symbolic link"):
        check_links(str(src))


def test_a_hugging_face_cache_snapshot_may_link_into_its_blobs(tmp_path):
    repo = tmp_path / "models--org--name"
    snapshot = repo / "snapshots" / "0123abc"
    (snapshot / "unet").mkdir(parents=True)
    (repo / "blobs").mkdir()
    blob = repo / "blobs" / "e3b0c442"
    blob.write_text("{}")
    (snapshot / "unet" / "config.json").symlink_to(os.path.relpath(blob, snapshot / "unet"))
    check_links(str(snapshot))
    (snapshot / "unet" / "escape.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ImportFailure, match="escape.json: a symbolic link"):
        check_links(str(snapshot))


SD_UNET = {"_class_name": "UNet2DConditionModel", "block_out_channels": [320, 640, 1280, 1280],
           "layers_per_block": 2, "attention_head_dim": 8, "cross_attention_dim": 768,
           "sample_size": 64, "norm_eps": 1e-05, "transformer_layers_per_block": 1,
           "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"]}


def test_configs_of_real_sizes_pass():
    check_config_sizes(SD_UNET, "unet/config.json")
    check_config_sizes({"num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 128256,
                        "rope_theta": 500000, "max_position_embeddings": 131072,
                        "rope_scaling": {"factor": 8.0, "original_max_position_embeddings": 8192}},
                       "text_encoder/config.json")


@pytest.mark.parametrize("field, value, message", [
    ("layers_per_block", 100000, "field 'layers_per_block' is 100000; qpool imports at most 1024"),
    ("num_hidden_layers", 5000, "field 'num_hidden_layers' is 5000"),
    ("cross_attention_dim", 1 << 24, "field 'cross_attention_dim' is 16777216"),
    ("down_block_types", ["DownBlock2D"] * 1000, "field 'down_block_types' has 1000 entries"),
    ("text_config", {"num_layers": 99999}, "field 'text_config.num_layers' is 99999"),
])
def test_absurd_sizes_are_refused_naming_the_field(field, value, message):
    with pytest.raises(ImportFailure, match=message.replace("(", r"\(")):
        check_config_sizes({**SD_UNET, field: value}, "unet/config.json")


# ------------------------------------------------------------------ T5 from tokenizer.json


@pytest.fixture(scope="module")
def t5_tokenizer_json(tmp_path_factory):
    """(T5's SentencePiece model trained on the exporter's corpus, the tokenizer.json
    T5TokenizerFast saves from it)."""
    spm = pytest.importorskip("sentencepiece")
    transformers = pytest.importorskip("transformers")
    from qpool_export import corpus

    out = tmp_path_factory.mktemp("t5")
    (out / "corpus.txt").write_text("\n".join(corpus.PROMPTS))
    spm.SentencePieceTrainer.train(input=str(out / "corpus.txt"), model_prefix=str(out / "spiece"),
                                   vocab_size=300, model_type="unigram", pad_id=0, eos_id=1,
                                   unk_id=2, bos_id=-1, minloglevel=2)
    (out / "source").mkdir()
    (out / "source" / "spiece.model").write_bytes((out / "spiece.model").read_bytes())
    tokenizer = transformers.T5TokenizerFast.from_pretrained(str(out / "source"))
    tokenizer.save_pretrained(str(out / "saved"))
    return out / "spiece.model", out / "saved" / "tokenizer.json"


def test_t5s_model_rebuilt_from_tokenizer_json_gives_the_same_ids(t5_tokenizer_json):
    """Note [T5 from tokenizer.json]."""
    import sentencepiece as spm
    from qpool_export import corpus
    from qpool_export.t5_tokenizer import spiece_from_tokenizer_json

    original, tokenizer_json = t5_tokenizer_json
    rebuilt = spm.SentencePieceProcessor(model_proto=spiece_from_tokenizer_json(
        str(tokenizer_json)))
    want = spm.SentencePieceProcessor(model_file=str(original))
    assert rebuilt.vocab_size() == want.vocab_size()
    for prompt in list(corpus.PROMPTS) + ["  many   spaces  ", "ÉCOLE ﬁ ½ 日本語 🦊", "a cat " * 40,
                                          ""]:
        assert rebuilt.encode(prompt) == want.encode(prompt), prompt
    for name in ("pad", "eos", "unk"):
        assert getattr(rebuilt, f"{name}_id")() == getattr(want, f"{name}_id")()


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["model"].update(type="BPE"), "field 'model.type' is 'BPE'"),
    (lambda d: d.update(normalizer={"type": "NFKC"}), "field 'normalizer' has a 'NFKC' step"),
    (lambda d: d.update(pre_tokenizer={"type": "ByteLevel"}), "field 'pre_tokenizer' is"),
    (lambda d: d["added_tokens"].pop(), "sentinels <extra_id_N> are not"),
])
def test_a_tokenizer_json_it_cannot_rebuild_is_refused_naming_the_field(
        t5_tokenizer_json, tmp_path, edit, message):
    import json

    from qpool_export.t5_tokenizer import spiece_from_tokenizer_json

    data = json.loads(t5_tokenizer_json[1].read_text())
    edit(data)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ImportFailure, match=message):
        spiece_from_tokenizer_json(str(path))


def test_the_streamed_weights_are_the_files_of_the_variant_asked_for(tmp_path):
    from qpool_export.stream_import import weight_files

    names = ["model.safetensors", "model-00001-of-00002.safetensors",
             "model-00002-of-00002.safetensors", "model.fp16.safetensors",
             "model.fp16-00001-of-00002.safetensors", "model.fp16-00002-of-00002.safetensors",
             "model.bf16.safetensors", "notes.txt"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    found = [os.path.basename(p) for p in weight_files(str(tmp_path), None)]
    assert found == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                     "model.safetensors"]
    found = [os.path.basename(p) for p in weight_files(str(tmp_path), "fp16")]
    assert found == ["model.fp16-00001-of-00002.safetensors",
                     "model.fp16-00002-of-00002.safetensors", "model.fp16.safetensors"]


def test_a_safety_checker_in_the_folder_is_named_as_not_imported():
    from qpool_export.from_diffusers import safety_checker_note

    shipped = {"safety_checker": ["stable_diffusion", "StableDiffusionSafetyChecker"]}
    assert "safety_checker: not imported" in safety_checker_note(shipped)
    assert safety_checker_note({"safety_checker": [None, None]}) == ""
    assert safety_checker_note({}) == ""


def test_progress_is_printed_by_tenths_for_large_components_only(capsys):
    from qpool_export.import_steps import Progress

    large, small = Progress("transformer"), Progress("vae_decoder")
    total = 20 << 30
    for done in range(0, total + 1, total // 40):
        large(done, total)
        small(done // 100, total // 100)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 9 and all(line.startswith("transformer: ") for line in lines), lines
    assert lines[0] == "transformer: 2.1 of 21.5 GB written"
