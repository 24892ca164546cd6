"""The configurations a single-file checkpoint does not carry, per family: the component configs
and scheduler settings of each family's reference diffusers folder (Stable Diffusion 1.5, 2.1,
SDXL base 1.0, FLUX.1 dev and schnell), written as diffusers' and transformers' config.json files
would hold them. `qpool_export from-single-file --config DIR` takes them from a diffusers folder
instead (a fine-tune with another architecture, or the tests' small models).
"""

from __future__ import annotations

import copy
from typing import Dict

_SD_SCHEDULE = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
                "num_train_timesteps": 1000, "steps_offset": 1, "set_alpha_to_one": False,
                "skip_prk_steps": True, "clip_sample": False, "trained_betas": None}

_CLIP_L = {"architectures": ["CLIPTextModel"], "model_type": "clip_text_model",
           "hidden_act": "quick_gelu", "hidden_size": 768, "intermediate_size": 3072,
           "num_attention_heads": 12, "num_hidden_layers": 12, "max_position_embeddings": 77,
           "vocab_size": 49408, "projection_dim": 768, "layer_norm_eps": 1e-05,
           "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1}

_VAE = {"_class_name": "AutoencoderKL", "act_fn": "silu", "in_channels": 3, "out_channels": 3,
        "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "latent_channels": 4,
        "norm_num_groups": 32, "down_block_types": ["DownEncoderBlock2D"] * 4,
        "up_block_types": ["UpDecoderBlock2D"] * 4, "scaling_factor": 0.18215,
        "sample_size": 512}

_SD_UNET = {"_class_name": "UNet2DConditionModel", "act_fn": "silu", "attention_head_dim": 8,
            "block_out_channels": [320, 640, 1280, 1280], "cross_attention_dim": 768,
            "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
            "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
            "in_channels": 4, "out_channels": 4, "layers_per_block": 2, "norm_num_groups": 32,
            "norm_eps": 1e-05, "sample_size": 64, "flip_sin_to_cos": True, "freq_shift": 0,
            "downsample_padding": 1, "mid_block_scale_factor": 1}

_SD_INDEX = {"_class_name": "StableDiffusionPipeline",
             "text_encoder": ["transformers", "CLIPTextModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"],
             "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
             "scheduler": ["diffusers", "PNDMScheduler"]}

SD1 = {
    "model_index": _SD_INDEX,
    "unet": _SD_UNET,
    "vae": _VAE,
    "text_encoder": _CLIP_L,
    "scheduler": {"_class_name": "PNDMScheduler", **_SD_SCHEDULE,
                  "prediction_type": "epsilon"},
}

SD2 = {
    "model_index": {**_SD_INDEX, "scheduler": ["diffusers", "DDIMScheduler"]},
    "unet": {**_SD_UNET, "attention_head_dim": [5, 10, 20, 20], "cross_attention_dim": 1024,
             "use_linear_projection": True, "upcast_attention": True, "sample_size": 96},
    "vae": {**_VAE, "sample_size": 768},
    "text_encoder": {**_CLIP_L, "hidden_act": "gelu", "hidden_size": 1024,
                     "intermediate_size": 4096, "num_attention_heads": 16,
                     # SD 2.x reads OpenCLIP's penultimate layer: diffusers' encoder stops there.
                     "num_hidden_layers": 23, "projection_dim": 512},
    "scheduler": {"_class_name": "DDIMScheduler", **_SD_SCHEDULE,
                  "prediction_type": "v_prediction"},
}

SDXL = {
    "model_index": {"_class_name": "StableDiffusionXLPipeline",
                    "text_encoder": ["transformers", "CLIPTextModel"],
                    "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
                    "tokenizer": ["transformers", "CLIPTokenizer"],
                    "tokenizer_2": ["transformers", "CLIPTokenizer"],
                    "unet": ["diffusers", "UNet2DConditionModel"],
                    "vae": ["diffusers", "AutoencoderKL"],
                    "scheduler": ["diffusers", "EulerDiscreteScheduler"],
                    "force_zeros_for_empty_prompt": True},
    "unet": {**_SD_UNET, "addition_embed_type": "text_time", "addition_time_embed_dim": 256,
             "attention_head_dim": [5, 10, 20], "block_out_channels": [320, 640, 1280],
             "cross_attention_dim": 2048,
             "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
             "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
             "projection_class_embeddings_input_dim": 2816, "sample_size": 128,
             "transformer_layers_per_block": [1, 2, 10], "use_linear_projection": True},
    "vae": {**_VAE, "scaling_factor": 0.13025, "force_upcast": True, "sample_size": 1024},
    "text_encoder": _CLIP_L,
    "text_encoder_2": {**_CLIP_L, "architectures": ["CLIPTextModelWithProjection"],
                       "hidden_act": "gelu", "hidden_size": 1280, "intermediate_size": 5120,
                       "num_attention_heads": 20, "num_hidden_layers": 32,
                       "projection_dim": 1280},
    "scheduler": {"_class_name": "EulerDiscreteScheduler", **_SD_SCHEDULE,
                  "prediction_type": "epsilon", "interpolation_type": "linear",
                  "timestep_spacing": "leading", "use_karras_sigmas": False},
}

_FLUX_SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
                   "shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5,
                   "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096}

FLUX_DEV = {
    "model_index": {"_class_name": "FluxPipeline",
                    "text_encoder": ["transformers", "CLIPTextModel"],
                    "tokenizer": ["transformers", "CLIPTokenizer"],
                    "text_encoder_2": ["transformers", "T5EncoderModel"],
                    "tokenizer_2": ["transformers", "T5TokenizerFast"],
                    "transformer": ["diffusers", "FluxTransformer2DModel"],
                    "vae": ["diffusers", "AutoencoderKL"],
                    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]},
    "transformer": {"_class_name": "FluxTransformer2DModel", "attention_head_dim": 128,
                    "axes_dims_rope": [16, 56, 56], "guidance_embeds": True, "in_channels": 64,
                    "joint_attention_dim": 4096, "num_attention_heads": 24, "num_layers": 19,
                    "num_single_layers": 38, "patch_size": 1, "pooled_projection_dim": 768},
    "vae": {**_VAE, "latent_channels": 16, "scaling_factor": 0.3611, "shift_factor": 0.1159,
            "use_quant_conv": False, "use_post_quant_conv": False, "force_upcast": True,
            "mid_block_add_attention": True, "sample_size": 1024},
    "text_encoder": _CLIP_L,
    "text_encoder_2": {"architectures": ["T5EncoderModel"], "model_type": "t5", "d_ff": 10240,
                       "d_kv": 64, "d_model": 4096, "dense_act_fn": "gelu_new",
                       "feed_forward_proj": "gated-gelu", "is_gated_act": True,
                       "layer_norm_epsilon": 1e-06, "num_heads": 64, "num_layers": 24,
                       "relative_attention_max_distance": 128,
                       "relative_attention_num_buckets": 32, "vocab_size": 32128,
                       "tie_word_embeddings": False, "dropout_rate": 0.1},
    "scheduler": _FLUX_SCHEDULER,
}

FLUX_SCHNELL = {
    **FLUX_DEV,
    "transformer": {**FLUX_DEV["transformer"], "guidance_embeds": False},
    "scheduler": {**_FLUX_SCHEDULER, "shift": 1.0, "use_dynamic_shifting": False},
}

FAMILIES = {"sd1": SD1, "sd2": SD2, "sdxl": SDXL, "flux-dev": FLUX_DEV,
            "flux-schnell": FLUX_SCHNELL}
# What each family's defaults are those of, for the manifest.
REFERENCES = {"sd1": "Stable Diffusion 1.5", "sd2": "Stable Diffusion 2.1 (768, v-prediction)",
              "sdxl": "Stable Diffusion XL base 1.0", "flux-dev": "FLUX.1 [dev]",
              "flux-schnell": "FLUX.1 [schnell]"}


def family(name: str) -> Dict[str, Dict[str, object]]:
    """A copy of the configs of family `name` (FAMILIES)."""
    return copy.deepcopy(FAMILIES[name])
