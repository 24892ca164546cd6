"""bench/kernel_table.py's groups for the kernel names a GPU profile holds: the libraries'
(cuBLAS, cuDNN, FlashAttention, ATen, qpool's) and a compiled package's Triton kernels, which
Inductor names after the operators they fuse."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import kernel_table  # noqa: E402


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
     "matrix product"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "matrix product"),
    ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64",
     "convolution"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>",
     "attention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel>", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::Half, WelfordOps>>",
     "normalisation"),
    # qpool's fused GELUs: named neither "gelu" alone nor after their products and joins.
    ("void qpool::quant::cuda::(anonymous namespace)::GegluKernel<__half, 8, 16>(__half const*, "
     "long, __half*, long, long)", "elementwise"),
    ("void qpool::quant::cuda::(anonymous namespace)::CatGeluKernel<__nv_bfloat16, 8, 16>",
     "elementwise"),
    # The passes that quantize w8a8 activations, a norm's kernel among them when it quantizes.
    ("void qpool::quant::cuda::(anonymous namespace)::QuantizeHeldRowsKernel<qpool::quant::cuda::"
     "(anonymous namespace)::GegluRows<__half>, 128, 5>(qpool::quant::cuda::(anonymous namespace)"
     "::GegluRows<__half>, float const*, long, long, signed char*, float*, float*)",
     "quantizing"),
    ("void qpool::quant::cuda::(anonymous namespace)::LayerNormKernel<__half, 5, true, true>("
     "__half const*, __half const*, __half const*, __half const*, __half*, __half*, long, int, "
     "float, qpool::quant::cuda::(anonymous namespace)::RowsOut)", "quantizing"),
    ("void qpool::quant::cuda::(anonymous namespace)::LayerNormKernel<__half, 5, true, false>("
     "__half const*, __half const*, __half const*, __half const*, __half*, __half*, long, int, "
     "float, qpool::quant::cuda::(anonymous namespace)::RowsOut)", "normalisation"),
    # Inductor's kernels: named after what they fuse, grouped by what they are.
    ("triton_poi_fused_convolution_silu_3", "generated fused"),
    ("triton_poi_fused__scaled_dot_product_cudnn_attention_5", "generated fused"),
    ("triton_poi_fused_cat_mm_12", "generated fused"),
    ("triton_red_fused_native_group_norm_silu_7", "normalisation"),
    ("triton_per_fused_std_mean_2", "normalisation"),
    ("triton_tem_fused_mm_4", "matrix product"),
    ("triton_tem_fused_convolution_9", "convolution"),
    ("triton_tem_fused_flex_attention_1", "attention"),
])
def test_each_kernel_falls_in_its_kind(name, kind):
    assert kernel_table.kind_of(name) == kind


def test_groups_sum_every_row_once():
    rows = [("triton_poi_fused_convolution_silu_3", 30, 300.0),
            ("sm90_xmma_fprop_implicit_gemm_f16", 30, 600.0),
            ("triton_red_fused_native_group_norm_7", 30, 100.0)]
    groups = kernel_table.group(rows, top=3)
    assert list(groups) == ["convolution", "generated fused", "normalisation"]
    assert groups["generated fused"]["us"] == 300.0
    assert abs(sum(g["share"] for g in groups.values()) - 1) < 1e-12
