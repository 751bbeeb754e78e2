// The activation functions of transformers, in float.
#ifndef TESSERA_ACTIVATIONS_GLSL
#define TESSERA_ACTIVATIONS_GLSL

// erfc(z) for z >= 0 (GLSL has no erf): the Chebyshev fit of Press et al., Numerical Recipes
// (2nd ed., section 6.2), fractional error below 1.2e-7.
float erfc_non_negative(float z) {
  float t = 1.0 / (1.0 + 0.5 * z);
  float poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 +
               t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
  return t * exp(-z * z + poly);
}

// PyTorch's nn.GELU() (approximate='none'), x/2 (1 + erf(x/sqrt 2)) = x/2 erfc(-x/sqrt 2): through
// erfc, so that the negative tail keeps its relative precision instead of cancelling in 1 + erf.
float gelu(float x) {
  float tail = erfc_non_negative(abs(x) * 0.70710678118654752);
  return 0.5 * x * (x >= 0.0 ? 2.0 - tail : tail);
}

// nn.SiLU: exp(-x) overflows to infinity for x below -88, where x / inf gives the limit, 0.
float silu(float x) { return x / (1.0 + exp(-x)); }

#endif
