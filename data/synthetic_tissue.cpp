#include "data/synthetic_tissue.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

namespace tessera::data {

namespace {

constexpr double two_pi = 2 * std::numbers::pi;

uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

uint32_t hash_cell(int64_t i, int64_t j, uint32_t salt) {
  return mix(static_cast<uint32_t>(i) * 0x9e3779b1U ^ mix(static_cast<uint32_t>(j) + salt));
}

double unit(uint32_t h) { return static_cast<double>(h) * (1.0 / 4294967296.0); }

// atan2 in [0, 2 pi) to within about 1e-5 radians (a fraction of a pixel on any slide), several
// times faster than std::atan2; the per-pixel polygon test runs on it.
double fast_angle(double y, double x) {
  double ax = std::abs(x), ay = std::abs(y), high = std::max(ax, ay);
  if (high == 0) return 0;
  double a = std::min(ax, ay) / high, s = a * a;
  double angle = ((-0.0464964749 * s + 0.15931422) * s - 0.327622764) * s * a + a;
  if (ay > ax) angle = std::numbers::pi / 2 - angle;
  if (x < 0) angle = std::numbers::pi - angle;
  if (y < 0) angle = two_pi - angle;
  return angle;
}

// Smooth noise in [0, 1): a seeded 256 x 256 lattice of values, bilinearly interpolated with a
// smoothstep, repeating every 256 lattice cells.
class ValueNoise {
 public:
  explicit ValueNoise(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(0, 1);
    for (auto& value : lattice_) value = uniform(rng);
  }

  // x, y >= 0; `frequency` is lattice cells per pixel.
  double at(double x, double y, double frequency) const {
    double fx = x * frequency, fy = y * frequency;
    auto i = static_cast<uint32_t>(fx), j = static_cast<uint32_t>(fy);
    double tx = fx - i, ty = fy - j;
    tx = tx * tx * (3 - 2 * tx);
    ty = ty * ty * (3 - 2 * ty);
    auto value = [&](uint32_t a, uint32_t b) { return static_cast<double>(lattice_[(b & 255) * 256 + (a & 255)]); };
    double top = value(i, j) + (value(i + 1, j) - value(i, j)) * tx;
    double bottom = value(i, j + 1) + (value(i + 1, j + 1) - value(i, j + 1)) * tx;
    return top + (bottom - top) * ty;
  }

 private:
  std::array<float, 256 * 256> lattice_{};
};

// sin over one period in 1024 steps, for the stroma's fibres.
class SineTable {
 public:
  SineTable() {
    for (size_t i = 0; i < values_.size(); ++i) values_[i] = std::sin(two_pi * static_cast<double>(i) / values_.size());
  }
  double operator()(double radians) const {
    auto step = static_cast<int64_t>(radians * (static_cast<double>(values_.size()) / two_pi));
    return values_[static_cast<size_t>(step) & (values_.size() - 1)];
  }

 private:
  std::array<double, 1024> values_{};
};

// A polygon whose vertices lie at evenly spaced angles around a centre, so a point's wedge is
// found from its angle and containment is one edge test.
class StarPolygon {
 public:
  // The radius varies by at most `roughness` times `radius` around the centre.
  StarPolygon(double cx, double cy, double radius, std::mt19937_64& rng, double roughness) : cx_(cx), cy_(cy) {
    constexpr int vertex_count = 96;
    constexpr double harmonic_sum = 1 + 1 / 2.0 + 1 / 3.0 + 1 / 4.0;
    std::uniform_real_distribution<double> phase(0, two_pi), amplitude(0.3, 1.0);
    std::array<double, 4> amplitudes{}, phases{};
    for (size_t k = 0; k < amplitudes.size(); ++k) {
      amplitudes[k] = roughness * amplitude(rng) / static_cast<double>(k + 1) / harmonic_sum;
      phases[k] = phase(rng);
    }
    for (int v = 0; v < vertex_count; ++v) {
      double angle = two_pi * v / vertex_count, scale = 1;
      for (size_t k = 0; k < amplitudes.size(); ++k)
        scale += amplitudes[k] * std::cos(static_cast<double>(k + 1) * angle + phases[k]);
      xs_.push_back(cx + radius * scale * std::cos(angle));
      ys_.push_back(cy + radius * scale * std::sin(angle));
    }
    inner_ = outer_ = std::hypot(xs_[0] - cx, ys_[0] - cy);
    for (size_t v = 0; v < xs_.size(); ++v) {
      size_t next = (v + 1) % xs_.size();
      outer_ = std::max(outer_, std::hypot(xs_[v] - cx, ys_[v] - cy));
      inner_ = std::min(inner_, segment_distance(cx, cy, xs_[v], ys_[v], xs_[next], ys_[next]));
    }
  }

  bool contains(double x, double y) const {
    size_t v = wedge(fast_angle(y - cy_, x - cx_));
    size_t next = (v + 1) % xs_.size();
    return (xs_[next] - xs_[v]) * (y - ys_[v]) - (ys_[next] - ys_[v]) * (x - xs_[v]) >= 0;
  }

  enum class Overlap { outside, inside, partial };
  // How the rectangle [x0, x1] x [y0, y1] lies relative to the polygon, from the distance bounds
  // of the boundary within the wedges the rectangle spans.
  Overlap overlap(double x0, double y0, double x1, double y1) const {
    double near_x = std::clamp(cx_, x0, x1) - cx_, near_y = std::clamp(cy_, y0, y1) - cy_;
    double far_x = std::max(std::abs(x0 - cx_), std::abs(x1 - cx_));
    double far_y = std::max(std::abs(y0 - cy_), std::abs(y1 - cy_));
    double near = std::hypot(near_x, near_y), far = std::hypot(far_x, far_y);
    if (near > outer_) return Overlap::outside;
    if (far < inner_) return Overlap::inside;
    if (near == 0) return Overlap::partial;
    // The rectangle does not hold the centre, so its corners span an arc under half a turn:
    // the arc starts after the largest gap between the corner angles.
    std::array<double, 4> angles{fast_angle(y0 - cy_, x0 - cx_), fast_angle(y0 - cy_, x1 - cx_),
                                 fast_angle(y1 - cy_, x0 - cx_), fast_angle(y1 - cy_, x1 - cx_)};
    std::sort(angles.begin(), angles.end());
    size_t start = 0;
    double largest_gap = angles[0] + two_pi - angles[3];
    for (size_t i = 1; i < angles.size(); ++i)
      if (angles[i] - angles[i - 1] > largest_gap) {
        largest_gap = angles[i] - angles[i - 1];
        start = i;
      }
    size_t first = wedge(angles[start]), last = wedge(angles[(start + 3) % 4]);
    double local_inner = outer_, local_outer = 0;
    for (size_t v = first;; v = (v + 1) % xs_.size()) {
      size_t next = (v + 1) % xs_.size();
      local_inner = std::min(local_inner, segment_distance(cx_, cy_, xs_[v], ys_[v], xs_[next], ys_[next]));
      local_outer =
          std::max({local_outer, std::hypot(xs_[v] - cx_, ys_[v] - cy_), std::hypot(xs_[next] - cx_, ys_[next] - cy_)});
      if (v == last) break;
    }
    if (near > local_outer) return Overlap::outside;
    if (far < local_inner) return Overlap::inside;
    return Overlap::partial;
  }

  double area() const {
    double twice = 0;
    for (size_t v = 0; v < xs_.size(); ++v) {
      size_t next = (v + 1) % xs_.size();
      twice += xs_[v] * ys_[next] - xs_[next] * ys_[v];
    }
    return std::abs(twice) / 2;
  }

  nlohmann::json ring() const {
    auto coordinates = nlohmann::json::array();
    for (size_t v = 0; v <= xs_.size(); ++v) coordinates.push_back({xs_[v % xs_.size()], ys_[v % ys_.size()]});
    return coordinates;
  }

  double cx() const { return cx_; }
  double cy() const { return cy_; }
  double inner() const { return inner_; }

 private:
  size_t wedge(double angle) const {
    return std::min(xs_.size() - 1, static_cast<size_t>(angle * (static_cast<double>(xs_.size()) / two_pi)));
  }

  static double segment_distance(double px, double py, double ax, double ay, double bx, double by) {
    double dx = bx - ax, dy = by - ay;
    double t = std::clamp(((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy), 0.0, 1.0);
    return std::hypot(px - ax - t * dx, py - ay - t * dy);
  }

  double cx_, cy_, inner_ = 0, outer_ = 0;
  std::vector<double> xs_, ys_;
};

struct Rgb {
  double r, g, b;
};

Rgb mix_colour(const Rgb& a, const Rgb& b, double t) {
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}

uint8_t to_byte(double value) { return static_cast<uint8_t>(std::clamp(value, 0.0, 255.0)); }

// Nuclei sit one per cell of a square grid (some cells empty), each inside its cell, so a pixel
// only looks at its own cell.
struct NucleusStyle {
  double cell, presence, min_radius, max_radius;
  Rgb colour;
  uint32_t salt;
};

class TissueModel {
 public:
  TissueModel(int64_t width, int64_t height, uint64_t seed, bool with_tumour, bool fluorescence, int channels)
      : seed_(mix(static_cast<uint32_t>(seed)) ^ static_cast<uint32_t>(seed >> 32)), noise_(seed_),
        fluorescence_(fluorescence), channels_(channels) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> uniform(0, 1);
    double aspect = static_cast<double>(width) / static_cast<double>(height);
    // At most 64 cells a side: a slide of any aspect (1 x 2^31) lays out a bounded number of shapes.
    int columns = static_cast<int>(std::clamp(std::lround(2 * aspect), 1l, 64l));
    int rows = static_cast<int>(std::clamp(std::lround(2 / aspect), 1l, 64l));
    double cell_width = static_cast<double>(width) / columns, cell_height = static_cast<double>(height) / rows;
    double cell_size = std::min(cell_width, cell_height);
    std::vector<std::pair<int, int>> cells;
    for (int row = 0; row < rows; ++row)
      for (int column = 0; column < columns; ++column)
        if (uniform(rng) < 0.8 || (row == rows - 1 && column == columns - 1 && cells.size() < 2))
          cells.emplace_back(column, row);
    for (auto [column, row] : cells) {
      double cx = (column + 0.5 + 0.16 * (uniform(rng) - 0.5)) * cell_width;
      double cy = (row + 0.5 + 0.16 * (uniform(rng) - 0.5)) * cell_height;
      tissue_.emplace_back(cx, cy, cell_size * (0.26 + 0.07 * uniform(rng)), rng, 0.2);
    }
    for (size_t blob = 0; blob < tissue_.size(); ++blob) {
      if (uniform(rng) > 0.75 && !(blob + 1 == tissue_.size() && tumour_.empty())) continue;
      // Inside its host: the tumour reaches at most 1.2 times its radius from its centre.
      const StarPolygon& host = tissue_[blob];
      double angle = two_pi * uniform(rng), offset = 0.15 * host.inner() * uniform(rng);
      double room = host.inner() - offset;
      tumour_.emplace_back(host.cx() + offset * std::cos(angle), host.cy() + offset * std::sin(angle),
                           room * (0.6 + 0.25 * uniform(rng)) / 1.2, rng, 0.2);
    }
    // Drawn and dropped, so that the tint after them is the one the seed gives with tumour.
    if (!with_tumour) tumour_.clear();
    std::uniform_real_distribution<double> tint(0.95, 1.05);
    tint_ = {tint(rng), tint(rng), tint(rng)};
  }

  const std::vector<StarPolygon>& tumours() const { return tumour_; }

  double tissue_area() const { return total_area(tissue_); }
  double tumour_area() const { return total_area(tumour_); }

  bool in_tumour(double x, double y) const {
    return std::any_of(tumour_.begin(), tumour_.end(), [&](auto& polygon) { return polygon.contains(x, y); });
  }

  // Renders the size x size tile at (x0, y0) of the level with `downsample`, channels() bytes a
  // pixel; returns false (leaving `out` alone) when the tile holds background only.
  bool render(double downsample, int64_t x0, int64_t y0, int size, uint8_t* pixels) const {
    double left = static_cast<double>(x0) * downsample, top = static_cast<double>(y0) * downsample;
    double right = left + size * downsample, bottom = top + size * downsample;
    std::vector<std::pair<const StarPolygon*, bool>> tissue, tumour;  // polygon, partially covered
    for (auto& polygon : tissue_)
      if (auto overlap = polygon.overlap(left, top, right, bottom); overlap != StarPolygon::Overlap::outside)
        tissue.emplace_back(&polygon, overlap == StarPolygon::Overlap::partial);
    if (tissue.empty()) return false;
    for (auto& polygon : tumour_)
      if (auto overlap = polygon.overlap(left, top, right, bottom); overlap != StarPolygon::Overlap::outside)
        tumour.emplace_back(&polygon, overlap == StarPolygon::Overlap::partial);
    auto covers = [](const std::vector<std::pair<const StarPolygon*, bool>>& polygons, double x, double y) {
      for (auto& [polygon, partial] : polygons)
        if (!partial || polygon->contains(x, y)) return true;
      return false;
    };
    for (int row = 0; row < size; ++row) {
      double y = (static_cast<double>(y0 + row) + 0.5) * downsample;
      for (int column = 0; column < size; ++column) {
        double x = (static_cast<double>(x0 + column) + 0.5) * downsample;
        uint8_t* out = pixels + (static_cast<size_t>(row) * size + column) * static_cast<size_t>(channels_);
        if (!covers(tissue, x, y)) {
          std::fill_n(out, channels_, background());
          continue;
        }
        bool in_tumour = !tumour.empty() && covers(tumour, x, y);
        if (fluorescence_) {
          fluorescence_pixel(x, y, in_tumour, out);
          continue;
        }
        Rgb colour = tissue_colour(x, y, in_tumour);
        out[0] = to_byte(colour.r * tint_.r);
        out[1] = to_byte(colour.g * tint_.g);
        out[2] = to_byte(colour.b * tint_.b);
      }
    }
    return true;
  }

  // Glass under transmitted light; the dark of a fluorescence scan.
  uint8_t background() const { return fluorescence_ ? 4 : 245; }
  int channels() const { return channels_; }

 private:
  static double total_area(const std::vector<StarPolygon>& polygons) {
    double area = 0;
    for (auto& polygon : polygons) area += polygon.area();
    return area;
  }

  // Where a pixel falls among the nuclei: 0 outside any, else 1 at a nucleus' rim to 0.82 at its centre.
  double nucleus_shade(double x, double y, const NucleusStyle& style) const {
    auto ci = static_cast<int64_t>(x / style.cell), cj = static_cast<int64_t>(y / style.cell);
    uint32_t h = hash_cell(ci, cj, seed_ ^ style.salt);
    if (unit(h) >= style.presence) return 0;
    uint32_t h2 = mix(h), h3 = mix(h2), h4 = mix(h3);
    double radius = style.min_radius + (style.max_radius - style.min_radius) * unit(h2);
    double stretch = 0.8 + 0.45 * unit(h4), reach = radius * 1.25;
    double nx = static_cast<double>(ci) * style.cell + reach + (style.cell - 2 * reach) * unit(h3);
    double ny = static_cast<double>(cj) * style.cell + reach + (style.cell - 2 * reach) * unit(mix(h4));
    double dx = (x - nx) * stretch, dy = (y - ny) / stretch;
    double d2 = (dx * dx + dy * dy) / (radius * radius);
    return d2 < 1 ? 0.82 + 0.18 * d2 : 0;
  }

  double fibre_at(double x, double y) const {
    return 0.5 + 0.5 * sine_((x * 0.9 + y * 0.4) / 9.0 + 7 * noise_.at(x, y, 1 / 160.0));
  }

  // A multiplex immunofluorescence panel: DAPI (nuclei), panCK (tumour cells), tissue
  // autofluorescence (stroma), then sparse immune cells, one population a channel. Three channels
  // are the composite a scanner writes as RGB: panCK red, autofluorescence green, DAPI blue.
  void fluorescence_pixel(double x, double y, bool tumour, uint8_t* out) const {
    const NucleusStyle& style = tumour ? kCancer : kNormal;
    double grain = (unit(hash_cell(static_cast<int64_t>(x), static_cast<int64_t>(y), seed_)) - 0.5) * 6;
    double nucleus = nucleus_shade(x, y, style);
    double dapi = nucleus > 0 ? 230 - 120 * (nucleus - 0.82) / 0.18 : 16;
    double keratin = tumour ? (nucleus > 0 ? 70 : 160) : 10;
    double stroma = 18 + 46 * fibre_at(x, y) * (0.6 + 0.8 * noise_.at(x + 5e4, y, 1 / 700.0));
    std::array<double, 3> panel{dapi, keratin, stroma};
    if (channels_ == 3) panel = {keratin, stroma, dapi};
    for (int c = 0; c < channels_; ++c) {
      double value = c < 3 ? panel[static_cast<size_t>(c)] : 8;
      if (c >= 3) {
        NucleusStyle immune{40, 0.07, 5, 7, {}, 0x3a11U + static_cast<uint32_t>(c) * 0x9e37U};
        if (nucleus_shade(x, y, immune) > 0) value = 190;
      }
      out[c] = to_byte(value + grain);
    }
  }

  Rgb tissue_colour(double x, double y, bool tumour) const {
    static constexpr Rgb pale_stroma{244, 190, 215}, dense_stroma{222, 128, 178}, cellular_stroma{205, 130, 190};
    uint32_t grain_hash = hash_cell(static_cast<int64_t>(x), static_cast<int64_t>(y), seed_);
    double grain = (unit(grain_hash) - 0.5) * 14;
    const NucleusStyle& style = tumour ? kCancer : kNormal;
    if (double shade = nucleus_shade(x, y, style); shade > 0)
      return {style.colour.r * shade + grain, style.colour.g * shade + grain, style.colour.b * shade + grain};
    double fibre = fibre_at(x, y);
    Rgb stroma = mix_colour(pale_stroma, dense_stroma, 0.35 * fibre + 0.4 * noise_.at(x + 5e4, y, 1 / 700.0));
    if (tumour) stroma = mix_colour(stroma, cellular_stroma, 0.5);
    return {stroma.r + grain, stroma.g + grain, stroma.b + grain};
  }

  static constexpr NucleusStyle kNormal{28, 0.55, 4.5, 7.0, {118, 68, 162}, 0x51ed27U};
  static constexpr NucleusStyle kCancer{19, 0.92, 7.0, 8.5, {72, 32, 118}, 0x2c1b3cU};

  uint32_t seed_;
  ValueNoise noise_;
  SineTable sine_;
  std::vector<StarPolygon> tissue_, tumour_;
  Rgb tint_{1, 1, 1};
  bool fluorescence_;
  int channels_;
};
}  // namespace

struct SyntheticTissue::Model : TissueModel {
  using TissueModel::TissueModel;
};

SyntheticTissue::SyntheticTissue(int64_t width, int64_t height, uint64_t seed, bool tumour, bool fluorescence,
                                 int channels)
    : model_(std::make_unique<Model>(width, height, seed, tumour, fluorescence, channels)) {}

SyntheticTissue::~SyntheticTissue() = default;

bool SyntheticTissue::render(double downsample, int64_t x0, int64_t y0, int size, uint8_t* pixels) const {
  return model_->render(downsample, x0, y0, size, pixels);
}

uint8_t SyntheticTissue::background() const { return model_->background(); }
int SyntheticTissue::channels() const { return model_->channels(); }
bool SyntheticTissue::in_tumour(double x, double y) const { return model_->in_tumour(x, y); }
double SyntheticTissue::tissue_area() const { return model_->tissue_area(); }
double SyntheticTissue::tumour_area() const { return model_->tumour_area(); }
size_t SyntheticTissue::tumour_count() const { return model_->tumours().size(); }

nlohmann::json SyntheticTissue::tumour_ring(size_t index) const { return model_->tumours().at(index).ring(); }

}  // namespace tessera::data
