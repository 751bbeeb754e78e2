// dx (+)= weight[c] * invstd[c] * (dy - per_element.x - xhat * per_element.y), with per_element
// the channel's (sum dy, sum dy * xhat) over the elements of the batch, or zero in evaluation;
// for the channel's elements [begin, end).
// Include after the bindings and gradient(i) (dy, masked by a fused ReLU).
#ifndef TESSERA_BATCH_NORM2D_INPUT_GRAD_GLSL
#define TESSERA_BATCH_NORM2D_INPUT_GRAD_GLSL

void write_input_grad(uint c, uint t, uint begin, uint end, vec2 per_element) {
  float mean = saved_mean[c], invstd = saved_invstd[c], scale = weight[c] * invstd;
  for (uint j = begin + t; j < end; j += gl_WorkGroupSize.x) {
    uint i = channel_element(c, j, p.channels, p.plane);
    float xhat = (float(x[i]) - mean) * invstd;
    float g = scale * (gradient(i) - per_element.x - xhat * per_element.y);
    dx[i] = ACT(p.accumulate != 0u ? float(dx[i]) + g : g);
  }
}

#endif
