// The first step of every pass over images: uint8 RGB as loaded, to the network's input.
#pragma once
#include "compute/tensor.h"
#include "compute/vk/kernels.h"
#include "compute/vk/recorder.h"

namespace tessera {

// Records images uint8 [N,H,W,3] -> input float [N,3,H,W] = (rgb/255 - mean) / std with
// ImageNet's mean and std, the normalisation torchvision's pretrained models expect.
void record_input_normalize(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& images, const Tensor& input);

}  // namespace tessera
