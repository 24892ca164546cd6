"""The random-weight diffusers pipelines the benchmarks build: SD 1.5- and SDXL-shaped folders
(the published configs, random weights, fp16) and, for CPU smoke tests, the same layouts at toy
widths. Used by import_bench.py and flop_share.py."""

from __future__ import annotations

import os

import torch

SD15_UNET = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                      "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                    "CrossAttnUpBlock2D"),
    cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32)
SD15_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32,
    block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4, sample_size=512, scaling_factor=0.18215)
CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
              num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu")
# stabilityai/stable-diffusion-xl-base-1.0's configs.
SDXL_UNET = dict(
    sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
    block_out_channels=(320, 640, 1280),
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=(5, 10, 20), cross_attention_dim=2048, transformer_layers_per_block=(1, 2, 10),
    use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816, norm_num_groups=32)
SDXL_VAE = dict(SD15_VAE, sample_size=1024, scaling_factor=0.13025, force_upcast=True)
# --tiny: the same layouts at toy widths (a CPU smoke test of this script's plumbing).
TINY = {
    "SD15_UNET": dict(sample_size=16, layers_per_block=1, block_out_channels=(32, 64),
                      down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                      up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                      attention_head_dim=4, norm_num_groups=8),
    "SDXL_UNET": dict(sample_size=16, layers_per_block=1, block_out_channels=(32, 64, 64),
                      attention_head_dim=(2, 2, 4), cross_attention_dim=64,
                      transformer_layers_per_block=(1, 1, 2), addition_time_embed_dim=16,
                      projection_class_embeddings_input_dim=32 + 6 * 16, norm_num_groups=8),
    "VAE": dict(layers_per_block=1, norm_num_groups=8, block_out_channels=(16, 32),
                down_block_types=("DownEncoderBlock2D",) * 2,
                up_block_types=("UpDecoderBlock2D",) * 2),
    "CLIP": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4),
    "CLIP_BIGG": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, projection_dim=32),
}
CLIP_BIGG = dict(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                 num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu",
                 projection_dim=1280)
MODELS = {
    "sd15": {"size": 512, "quantize": ("unet", "text_encoder")},
    "sdxl": {"size": 1024, "quantize": ("unet", "text_encoder", "text_encoder_2")},
}


def _clip(config: dict, tokenizer, projection: bool = False):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    return cls(CLIPTextConfig(**config, bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id))


def build(model: str, src: str, tokenizer_dir: str, device: str = "cuda",
          tiny: bool = False) -> None:
    """Random weights (initialized on `device`: the GPU is much faster), saved in float16; with
    `tiny`, the same layouts at toy widths (TINY)."""
    from diffusers import (AutoencoderKL, EulerDiscreteScheduler, PNDMScheduler,
                           StableDiffusionPipeline, StableDiffusionXLPipeline,
                           UNet2DConditionModel)
    from transformers import CLIPTokenizer

    torch.manual_seed(0)
    files = (os.path.join(tokenizer_dir, "vocab.json"), os.path.join(tokenizer_dir, "merges.txt"))
    tokenizer = CLIPTokenizer(*files, model_max_length=77)
    small = TINY if tiny else {}

    def sized(config: dict, key: str) -> dict:
        return dict(config, **small.get(key, {}))

    with torch.device(device):
        if model == "sd15":
            pipe = StableDiffusionPipeline(
                vae=AutoencoderKL(**sized(SD15_VAE, "VAE")),
                text_encoder=_clip(sized(CLIP_L, "CLIP"), tokenizer),
                tokenizer=tokenizer, unet=UNet2DConditionModel(**sized(SD15_UNET, "SD15_UNET")),
                scheduler=PNDMScheduler(beta_start=0.00085, beta_end=0.012,
                                        beta_schedule="scaled_linear", skip_prk_steps=True,
                                        steps_offset=1, set_alpha_to_one=False),
                safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        else:
            tokenizer_2 = CLIPTokenizer(*files, model_max_length=77, pad_token="!")
            pipe = StableDiffusionXLPipeline(
                vae=AutoencoderKL(**sized(SDXL_VAE, "VAE")),
                text_encoder=_clip(sized(CLIP_L, "CLIP"), tokenizer),
                text_encoder_2=_clip(sized(CLIP_BIGG, "CLIP_BIGG"), tokenizer_2, projection=True),
                tokenizer=tokenizer, tokenizer_2=tokenizer_2,
                unet=UNet2DConditionModel(**sized(SDXL_UNET, "SDXL_UNET")),
                scheduler=EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012,
                                                 beta_schedule="scaled_linear", steps_offset=1),
                force_zeros_for_empty_prompt=True)
    pipe.to(torch.float16).save_pretrained(src)
    del pipe
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
