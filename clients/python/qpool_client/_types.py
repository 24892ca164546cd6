"""What Generate and Encode return, as plain dataclasses, and the options of a generation."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:
    import numpy.typing as npt
    from PIL.Image import Image as PilImage

TensorDType = Literal["float32", "float16", "bfloat16", "int64"]


class GenerateOptions(TypedDict, total=False):
    """The optional fields of a generation (GenerateRequest in proto/qpool/v1/qpool.proto).
    Left out or None: the pipeline's default (Client.list_pipelines shows them)."""

    negative_prompt: str | None  # None: no negative prompt; "" is encoded as a prompt
    steps: int | None  # 1..limits.max_steps
    guidance_scale: float | None  # <= 1 disables classifier-free guidance
    width: int | None  # a multiple of 8
    height: int | None
    num_images: int | None  # image i uses seed + i
    seed: int | None  # None: random; GenerateResult.seed says which
    scheduler: str | None  # one of PipelineInfo.schedulers
    true_cfg_scale: float | None  # kind flux only
    # Size conditioning, kind sdxl only (diffusers' original_size, target_size and
    # crops_coords_top_left, as separate fields).
    original_width: int | None
    original_height: int | None
    target_width: int | None
    target_height: int | None
    crop_top: int | None
    crop_left: int | None


@dataclasses.dataclass(frozen=True)
class Progress:
    """A denoising step just finished."""

    step: int  # 1-based
    total: int
    elapsed_seconds: float  # since the request started running


@dataclasses.dataclass(frozen=True)
class Timings:
    """Where a generation's time went, in seconds."""

    queue_seconds: float
    encode_seconds: float
    denoise_seconds: float
    decode_seconds: float
    total_seconds: float
    png_seconds: float


@dataclasses.dataclass(frozen=True)
class Image:
    """One generated image: 8-bit RGB PNG bytes."""

    png: bytes = dataclasses.field(repr=False)
    width: int
    height: int

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the PNG bytes to `path`."""
        with open(path, "wb") as f:
            f.write(self.png)

    def to_pil(self) -> PilImage:
        """The image as a PIL.Image.Image (needs Pillow: pip install 'qpool-client[pil]')."""
        try:
            from PIL import Image as pil
        except ImportError as e:
            raise ImportError("Image.to_pil() needs Pillow: pip install 'qpool-client[pil]' "
                              "(or use Image.png, the PNG bytes)") from e
        import io

        image = pil.open(io.BytesIO(self.png))
        image.load()
        return image


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    """A finished generation."""

    images: list[Image]
    seed: int  # of the first image; image i used seed + i
    device: str  # where it ran, e.g. "cpu", "cuda:1"
    steps: int
    scheduler: str
    guidance_scale: float
    route: str  # why that device: "idle", "onload", "least-loaded" or "retry-oom"
    attempts: int  # 2 after a retry on another device
    batch_size: int  # requests denoised in one batch with it, itself included
    timings: Timings


_NUMPY_DTYPES = {"float32": "<f4", "float16": "<f2", "int64": "<i8"}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8}


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A dense tensor as the server sent it: row-major, little-endian `data`."""

    dtype: TensorDType
    shape: tuple[int, ...]
    data: bytes = dataclasses.field(repr=False)

    def numpy(self) -> npt.NDArray[Any]:
        """The tensor as a read-only numpy array (needs numpy: pip install 'qpool-client[numpy]').

        numpy has no bfloat16: a bfloat16 tensor comes back as float32, which holds every
        bfloat16 value exactly (for bfloat16 itself, see the README: torch.frombuffer).
        """
        try:
            import numpy as np
        except ImportError as e:
            raise ImportError("Tensor.numpy() needs numpy: pip install 'qpool-client[numpy]' "
                              "(or use Tensor.data, the raw bytes)") from e
        count = 1
        for dim in self.shape:
            count *= dim
        if len(self.data) != count * _ITEMSIZE[self.dtype]:
            raise ValueError(f"{len(self.data)} bytes do not hold a {self.dtype} tensor of "
                             f"shape {self.shape}")
        if self.dtype == "bfloat16":  # the upper half of a float32's bits
            high = np.frombuffer(self.data, dtype="<u2").astype("<u4") << 16
            array = high.view("<f4")
            array.flags.writeable = False
        else:
            array = np.frombuffer(self.data, dtype=_NUMPY_DTYPES[self.dtype])
        return array.reshape(self.shape)


@dataclasses.dataclass(frozen=True)
class Encoding:
    """What Encode returns: the text encoders' outputs for each prompt."""

    embeddings: Tensor  # [prompts, max_length, hidden]
    input_ids: Tensor  # [prompts, max_length], int64
    device: str
    route: str  # as GenerateResult.route
    pooled_embeddings: Tensor | None  # [prompts, dim], kinds that use them (sdxl)
    llm_embeddings: Tensor | None  # [layers, prompts, max_length, hidden] (hidream)
    llm_input_ids: Tensor | None  # [prompts, max_length] (hidream)
