#version 450
// step[0] += 1: one optimizer step done.
layout(local_size_x = 1) in;
layout(std430, binding = 0) buffer Step { uint step[]; };
void main() { step[0] += 1u; }
