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
