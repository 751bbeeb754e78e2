// Images that are not tiled slides, read through libvips: one level, random access.
#include <vips/vips.h>

#include <mutex>

#include "common/error.h"
#include "common/library_warnings.h"
#include "data/slide_parts.h"

namespace tessera::data {

namespace {

// libvips' error buffer, taken and cleared.
std::string vips_message() {
  char* text = vips_error_buffer_copy();
  std::string message = text ? text : "";
  g_free(text);
  while (!message.empty() && message.back() == '\n') message.pop_back();
  return message;
}

void start_vips() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (VIPS_INIT("tessera")) throw Error(ExitCode::runtime_error, "libvips: cannot start: " + vips_message());
  });
}

struct ImageRef {
  VipsImage* image = nullptr;
  ~ImageRef() {
    if (image) g_object_unref(image);
  }
};

class VipsSlide final : public Slide {
 public:
  explicit VipsSlide(const std::string& path) : path_(path) {
    start_vips();
    const char* loader = vips_foreign_find_load(path.c_str());
    if (!loader) throw BadInput(path + ": not an image libvips can read (" + vips_message() + ")");
    const char* nickname = vips_nickname_find(g_type_from_name(loader));  // "tiffload", "pngload" ...
    loader_ = nickname ? nickname : loader;
    ImageRef loaded, flat, colour;
    // A truncated or corrupt file is an error, not an image completed with black.
    loaded.image =
        vips_image_new_from_file(path.c_str(), "access", VIPS_ACCESS_RANDOM, "fail_on", VIPS_FAIL_ON_ERROR, nullptr);
    if (!loaded.image) fail("cannot open");
    VipsImage* current = loaded.image;
    if (vips_image_hasalpha(current)) {  // transparent is white, as OpenSlide's regions are here
      VipsArrayDouble* white = vips_array_double_newv(1, 255.0);
      int failed = vips_flatten(current, &flat.image, "background", white, nullptr);
      vips_area_unref(VIPS_AREA(white));
      if (failed) fail("cannot flatten its alpha channel");
      current = flat.image;
    }
    if (vips_colourspace(current, &colour.image, VIPS_INTERPRETATION_sRGB, nullptr)) fail("not an RGB image");
    if (vips_cast_uchar(colour.image, &image_.image, nullptr)) fail("cannot convert to 8 bits");
    VipsImage* image = image_.image;
    if (vips_image_get_bands(image) != 3)
      throw BadInput(path + ": " + std::to_string(vips_image_get_bands(image)) + " bands, not an RGB image");
    levels_.push_back({vips_image_get_width(image), vips_image_get_height(image), 1.0, 256, 256});
    // libvips keeps resolution in pixels per millimetre; 1 means the file does not say.
    double x_resolution = vips_image_get_xres(image), y_resolution = vips_image_get_yres(image);
    if (x_resolution > 1 && y_resolution > 1) {
      mpp_x_ = 1000 / x_resolution;
      mpp_y_ = 1000 / y_resolution;
    }
  }

  const std::string& path() const override { return path_; }
  std::string format() const override { return "vips:" + loader_; }
  const std::vector<SlideLevel>& levels() const override { return levels_; }
  double mpp_x() const override { return mpp_x_; }
  double mpp_y() const override { return mpp_y_; }

  void read_region(int level, int64_t x, int64_t y, int width, int height, uint8_t* rgb) const override {
    if (level != 0) throw BadInput(path_ + ": has one level, not " + std::to_string(level + 1));
    const LibraryFileScope scope(path_);  // what libvips logs names the slide
    std::memset(rgb, 255, static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
    int64_t x0 = std::max<int64_t>(x, 0), y0 = std::max<int64_t>(y, 0);
    int64_t x1 = std::min<int64_t>(x + width, levels_[0].width), y1 = std::min<int64_t>(y + height, levels_[0].height);
    if (x0 >= x1 || y0 >= y1) return;
    VipsRect rect{static_cast<int>(x0), static_cast<int>(y0), static_cast<int>(x1 - x0), static_cast<int>(y1 - y0)};
    VipsRegion* region = vips_region_new(image_.image);
    if (vips_region_prepare(region, &rect)) {
      g_object_unref(region);
      throw BadInput(path_ + ": libvips: region at " + std::to_string(x) + "," + std::to_string(y) + ": " +
                     vips_message());
    }
    for (int row = 0; row < rect.height; ++row)
      std::memcpy(rgb + ((y0 - y + row) * width + (x0 - x)) * 3, VIPS_REGION_ADDR(region, rect.left, rect.top + row),
                  static_cast<size_t>(rect.width) * 3);
    g_object_unref(region);
  }

  std::optional<std::vector<uint8_t>> jpeg_tile(int, int64_t, int64_t) const override { return std::nullopt; }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw BadInput(path_ + ": libvips: " + what + ": " + vips_message()); }

  std::string path_, loader_;
  ImageRef image_;
  std::vector<SlideLevel> levels_;
  double mpp_x_ = 0, mpp_y_ = 0;
};

}  // namespace

bool vips_can_read(const std::string& path) {
  start_vips();
  bool found = vips_foreign_find_load(path.c_str()) != nullptr;
  vips_error_clear();
  return found;
}

std::unique_ptr<Slide> open_vips_slide(const std::string& path) { return std::make_unique<VipsSlide>(path); }

}  // namespace tessera::data
