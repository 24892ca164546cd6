#include "api/request_convert.h"

namespace qpool::api {

GenerateRequestIn FromProto(const v1::GenerateRequest& r) {
  GenerateRequestIn in;
  in.pipeline = r.pipeline();
  in.prompt = r.prompt();
  if (r.has_negative_prompt()) in.negative_prompt = r.negative_prompt();
  if (r.has_steps()) in.steps = r.steps();
  if (r.has_guidance_scale()) in.guidance_scale = r.guidance_scale();
  if (r.has_width()) in.width = r.width();
  if (r.has_height()) in.height = r.height();
  if (r.has_num_images()) in.num_images = r.num_images();
  if (r.has_seed()) in.seed = r.seed();
  in.scheduler = r.scheduler();
  if (r.has_original_width()) in.original_width = r.original_width();
  if (r.has_original_height()) in.original_height = r.original_height();
  if (r.has_target_width()) in.target_width = r.target_width();
  if (r.has_target_height()) in.target_height = r.target_height();
  if (r.has_crop_top()) in.crop_top = r.crop_top();
  if (r.has_crop_left()) in.crop_left = r.crop_left();
  if (r.has_true_cfg_scale()) in.true_cfg_scale = r.true_cfg_scale();
  return in;
}

}  // namespace qpool::api
