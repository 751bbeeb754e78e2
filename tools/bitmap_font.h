// A 5x7 bitmap font for the words drawn into images (a heatmap's legend): built in, so an image
// is the same bytes on every machine, whatever fonts it has.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::cli {

// Width in pixels of `text` drawn at `scale` (each glyph 5 wide and one column apart).
int text_width(const std::string& text, int scale);

// Draws `text` (upper case; letters, digits, space and . , - ( ) : / = _ %; anything else as ?)
// with its top-left corner at x, y into an RGB image of `width` x `height`, clipped to it.
void draw_text(std::vector<uint8_t>& rgb, int width, int height, int x, int y, const std::string& text, int scale,
               const uint8_t colour[3]);

}  // namespace tessera::cli
