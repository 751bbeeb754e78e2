// Slide readers, synthetic slides, tissue detection, labels and the tiler, through the library.
#include <gtest/gtest.h>
#include <tiffio.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "data/jpeg.h"
#include "data/labels.h"
#include "data/slide.h"
#include "data/slide_parts.h"
#include "data/synthetic_slide.h"
#include "data/tile_store.h"
#include "data/tiler.h"
#include "data/tissue.h"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::data;

namespace {

// Per process (ctest runs the tests of this file in parallel, each in its own process), and
// removed as the process exits.
struct ScratchDirectory {
  fs::path path = fs::temp_directory_path() / ("tessera_test_data_slide_" + std::to_string(getpid()));
  ScratchDirectory() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDirectory() { fs::remove_all(path); }
};

fs::path directory() {
  static ScratchDirectory scratch;
  return scratch.path;
}

// One synthetic slide for the whole suite: 3072 x 2048, levels 3072, 1536.
const nlohmann::json& synthetic() {
  static nlohmann::json summary = [] {
    SyntheticSlideOptions options;
    options.width = 3072;
    options.height = 2048;
    options.seed = 11;
    options.workers = 2;
    return write_synthetic_slide(options,
                                 {(directory() / "slide.tiff").string(), (directory() / "slide.mask.tiff").string(),
                                  (directory() / "slide.geojson").string()});
  }();
  return summary;
}

std::string slide_path() {
  synthetic();
  return (directory() / "slide.tiff").string();
}

template <class Function>
std::string bad_input_message(Function&& function) {
  try {
    function();
  } catch (const BadInput& e) {
    return e.what();
  }
  ADD_FAILURE() << "no BadInput";
  return {};
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

TEST(Slide, SyntheticSlideIsAPyramidWithResolution) {
  EXPECT_EQ(synthetic()["levels"], nlohmann::json::parse("[[3072,2048],[1536,1024]]"));
  auto slide = open_slide(slide_path());
  EXPECT_EQ(slide->format(), "tiff");
  ASSERT_EQ(slide->levels().size(), 2u);
  EXPECT_EQ(slide->levels()[0].width, 3072);
  EXPECT_EQ(slide->levels()[1].height, 1024);
  EXPECT_DOUBLE_EQ(slide->levels()[1].downsample, 2.0);
  EXPECT_EQ(slide->levels()[0].tile_width, 256);
  EXPECT_NEAR(slide->mpp_x(), 0.25, 1e-6);
  double tissue = synthetic()["tissue_fraction"], tumour = synthetic()["tumour_fraction"];
  EXPECT_GT(tissue, 0.1);
  EXPECT_LT(tissue, 0.6);
  EXPECT_GT(tumour, 0.005);
  EXPECT_LT(tumour, tissue);
}

TEST(Slide, LibtiffAndOpenSlideReadTheSamePixels) {
  auto tiff = open_slide(slide_path(), uint64_t{8} << 20, SlideReader::libtiff);
  auto openslide = open_slide(slide_path(), uint64_t{8} << 20, SlideReader::openslide);
  EXPECT_EQ(openslide->format(), "openslide:generic-tiff");
  ASSERT_EQ(openslide->levels().size(), tiff->levels().size());
  for (int level = 0; level < 2; ++level) {
    // A region across four file tiles, part of it beyond the right edge at level 1.
    int64_t x = level == 0 ? 1000 : 1400, y = 700;
    std::vector<uint8_t> a(300 * 300 * 3), b(a.size());
    tiff->read_region(level, x, y, 300, 300, a.data());
    openslide->read_region(level, x, y, 300, 300, b.data());
    double difference = 0;
    int largest = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      int d = std::abs(int(a[i]) - int(b[i]));
      difference += d;
      largest = std::max(largest, d);
    }
    EXPECT_LT(difference / static_cast<double>(a.size()), 0.5) << "level " << level;
    EXPECT_LE(largest, 8) << "level " << level;
    if (level == 1) {
      EXPECT_EQ(a[(299 * 300 + 299) * 3], 255) << "beyond the edge is white";
    }
  }
}

TEST(Slide, FileJpegTilesDecodeToWhatTheReaderReturns) {
  auto slide = open_slide(slide_path());
  auto jpeg = slide->jpeg_tile(0, 4, 3);
  ASSERT_TRUE(jpeg.has_value());
  std::vector<uint8_t> decoded(256 * 256 * 3), region(decoded.size());
  EXPECT_EQ(decode_jpeg(jpeg->data(), jpeg->size(), 256, 256, decoded.data()), "");
  slide->read_region(0, 4 * 256, 3 * 256, 256, 256, region.data());
  EXPECT_EQ(decoded, region);
}

TEST(Tissue, DetectedTissueMatchesTheSyntheticTissueArea) {
  auto slide = open_slide(slide_path());
  TissueMask mask(*slide, 256);
  EXPECT_EQ(mask.level(), 1);
  EXPECT_EQ(mask.threshold(), default_tissue_threshold);
  double detected = mask.tissue_fraction(0, 0, 3072, 2048);
  EXPECT_NEAR(detected, synthetic()["tissue_fraction"].get<double>(), 0.02);
  EXPECT_EQ(mask.tissue_fraction(0, 0, 64, 64), 0.0) << "the corner is glass";
}

namespace {

// Label settings: a rule, its coverage fraction and what unannotated tissue becomes.
LabelOptions labelling(LabelRule rule, double coverage, const std::string& unannotated = "",
                       std::vector<std::string> classes = {}) {
  LabelOptions options;
  options.rule = rule;
  options.coverage = coverage;
  options.unannotated = unannotated;
  options.classes = std::move(classes);
  return options;
}

constexpr std::optional<uint32_t> left_out;

}  // namespace

TEST(Labels, GeoJsonPolygonsWithHolesAndMultiPolygons) {
  auto path = directory() / "shapes.geojson";
  write_text(path, R"({"type":"FeatureCollection","features":[
    {"type":"Feature","properties":{"classification":{"name":"Tumor"}},"geometry":{"type":"Polygon",
     "coordinates":[[[0,0],[100,0],[100,100],[0,100],[0,0]],[[40,40],[60,40],[60,60],[40,60],[40,40]]]}},
    {"type":"Feature","properties":{"classification":{"name":"Tumor"}},"geometry":{"type":"MultiPolygon",
     "coordinates":[[[[200,0],[300,0],[300,100],[200,100],[200,0]]],[[[400,0],[500,0],[500,100],[400,100],[400,0]]]]}},
    {"type":"Feature","properties":{"classification":{"name":"Stroma"}},"geometry":{"type":"Polygon",
     "coordinates":[[[600,0],[700,0],[700,100],[600,100],[600,0]]]}}]})");
  auto centre = open_labels(path.string(), 1000, 1000, labelling(LabelRule::centre, 0.5));
  EXPECT_EQ(centre->label(0, 0, 100, 100), left_out) << "the centre lies in the hole: no shape claims it";
  EXPECT_EQ(centre->label(0, 0, 40, 40), 1u);
  EXPECT_EQ(centre->label(200, 0, 300, 100), 1u);
  EXPECT_EQ(centre->label(400, 0, 500, 100), 1u);
  EXPECT_EQ(centre->label(300, 0, 400, 100), left_out);
  EXPECT_EQ(centre->label(600, 0, 700, 100), 0u) << "Stroma is a named class other than the label class";
  EXPECT_TRUE(centre->marks(200, 0, 300, 100));
  EXPECT_FALSE(centre->marks(600, 0, 700, 100)) << "only the label class marks tiles";
  auto exhaustive = open_labels(path.string(), 1000, 1000, labelling(LabelRule::centre, 0.5, "Normal"));
  EXPECT_EQ(exhaustive->label(0, 0, 100, 100), 0u) << "--unannotated Normal: the rest is label 0";
  EXPECT_EQ(exhaustive->label(300, 0, 400, 100), 0u);
  EXPECT_EQ(exhaustive->label(200, 0, 300, 100), 1u);
  // The square with its hole is 96% covered; of [50, 150) x [0, 100), 30 of 64 samples are
  // tumour (two fall in the hole) and 34 uncovered.
  auto coverage = open_labels(path.string(), 1000, 1000, labelling(LabelRule::coverage, 0.9));
  EXPECT_EQ(coverage->label(0, 0, 100, 100), 1u);
  EXPECT_EQ(coverage->label(50, 0, 150, 100), left_out);
  auto half = open_labels(path.string(), 1000, 1000, labelling(LabelRule::coverage, 0.45));
  EXPECT_EQ(half->label(50, 0, 150, 100), 1u) << "30/64 tumour reaches 0.45";
  auto credited = open_labels(path.string(), 1000, 1000, labelling(LabelRule::coverage, 0.45, "Normal"));
  EXPECT_EQ(credited->label(50, 0, 150, 100), 0u) << "the 34 uncovered samples are Normal's: the larger class";
  EXPECT_TRUE(credited->marks(50, 0, 150, 100)) << "the checks count the tumour alone";
  auto high = open_labels(path.string(), 1000, 1000, labelling(LabelRule::coverage, 0.9, "Normal"));
  EXPECT_EQ(high->label(50, 0, 150, 100), 0u) << "no class reaches 0.9: unannotated, so Normal";
}

TEST(Labels, ClassesNestedShapesAndShapesThatAnnotateNothing) {
  auto path = directory() / "classes.geojson";
  // A Stroma region holding a smaller Tumor island, a Necrosis square (not listed) and an
  // unclassified one; label i is the i-th of --classes.
  write_text(path, R"([
    {"type":"Feature","properties":{"classification":{"name":"Stroma"}},"geometry":{"type":"Polygon",
     "coordinates":[[[0,0],[400,0],[400,400],[0,400],[0,0]]]}},
    {"type":"Feature","properties":{"classification":{"name":"Tumor"}},"geometry":{"type":"Polygon",
     "coordinates":[[[100,100],[300,100],[300,300],[100,300],[100,100]]]}},
    {"type":"Feature","properties":{"classification":{"name":"Necrosis"}},"geometry":{"type":"Polygon",
     "coordinates":[[[500,0],[600,0],[600,100],[500,100],[500,0]]]}},
    {"type":"Feature","geometry":{"type":"Polygon","coordinates":[[[700,0],[800,0],[800,100],[700,100],[700,0]]]}}])");
  auto classes = labelling(LabelRule::centre, 0.5, "", {"Tumor", "Stroma", "Normal"});
  auto labels = open_labels(path.string(), 1000, 1000, classes);
  EXPECT_EQ(labels->label(150, 150, 250, 250), 0u) << "the smallest shape at the centre: the island";
  EXPECT_EQ(labels->label(0, 0, 100, 100), 1u);
  EXPECT_EQ(labels->label(500, 0, 600, 100), left_out) << "Necrosis is not among the classes";
  EXPECT_EQ(labels->label(700, 0, 800, 100), left_out) << "unclassified, without --unclassified-as";
  EXPECT_TRUE(labels->marks(0, 0, 100, 100)) << "with classes, every listed class marks";
  EXPECT_EQ(labels->warning(), path.string() + ": 2 polygons (1 unclassified, 1 Necrosis) annotate nothing: their "
                                               "classes are not among --classes Tumor,Stroma,Normal");
  classes.unannotated = "Normal";
  classes.unclassified_as = "Stroma";
  auto exhaustive = open_labels(path.string(), 1000, 1000, classes);
  EXPECT_EQ(exhaustive->label(500, 0, 600, 100), 2u);
  EXPECT_EQ(exhaustive->label(700, 0, 800, 100), 1u) << "unclassified as Stroma";
  // Coverage: of [200, 400) x [200, 400), a quarter is the island, the rest Stroma.
  classes.rule = LabelRule::coverage;
  auto coverage = open_labels(path.string(), 1000, 1000, classes);
  EXPECT_EQ(coverage->label(200, 200, 400, 400), 1u);
  EXPECT_EQ(coverage->label(350, 350, 450, 450), 2u) << "a quarter Stroma, the rest unannotated: Normal";
  classes.unannotated.clear();
  EXPECT_EQ(open_labels(path.string(), 1000, 1000, classes)->label(350, 350, 450, 450), left_out);
}

TEST(Labels, ClassOptionsAreChecked) {
  EXPECT_EQ(parse_class_names("Tumor,Stroma,Normal"), (std::vector<std::string>{"Tumor", "Stroma", "Normal"}));
  EXPECT_THROW(parse_class_names("Tumor,,Normal"), UsageError);
  EXPECT_THROW(parse_class_names("Tumor,Tumor"), UsageError);
  auto options = labelling(LabelRule::centre, 0.5, "Other", {"Tumor", "Stroma"});
  try {
    check_label_options(options);
    FAIL() << "--unannotated Other is not among the classes";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--unannotated: 'Other' is not one of --classes Tumor,Stroma");
  }
  options.classes.clear();
  EXPECT_NO_THROW(check_label_options(options)) << "binary: any name other than the label class is 0";
  EXPECT_EQ(options.label_of("Other"), 0u);
  EXPECT_EQ(options.label_of("Tumor"), 1u);
}

TEST(Labels, MaskAndGeoJsonOfASyntheticSlideAgree) {
  synthetic();
  auto mask = open_labels((directory() / "slide.mask.tiff").string(), 3072, 2048, labelling(LabelRule::centre, 0.5));
  auto geojson = open_labels((directory() / "slide.geojson").string(), 3072, 2048,
                             labelling(LabelRule::centre, 0.5, "Normal"));
  int agree = 0, tumour = 0, total = 0;
  for (int y = 0; y < 2048; y += 64)
    for (int x = 0; x < 3072; x += 64, ++total) {
      uint32_t a = mask->label(x, y, x + 64, y + 64).value(), b = geojson->label(x, y, x + 64, y + 64).value();
      agree += a == b;
      tumour += b;
    }
  EXPECT_GT(tumour, 0.5 * synthetic()["tumour_fraction"].get<double>() * total);
  EXPECT_GE(agree, total - tumour / 10 - 2);
}

TEST(Labels, ASlideWithoutTumourHasTheSameTissueAndEmptyGroundTruth) {
  SyntheticSlideOptions options;
  options.width = 3072;
  options.height = 2048;
  options.seed = 11;
  options.workers = 2;
  options.tumour = false;
  auto mask_path = directory() / "normal.mask.tiff", geojson_path = directory() / "normal.geojson";
  auto summary =
      write_synthetic_slide(options, {(directory() / "normal.tiff").string(), mask_path.string(), geojson_path.string()});
  EXPECT_EQ(summary["tumour_regions"], 0);
  EXPECT_EQ(summary["tumour_fraction"], 0.0);
  EXPECT_EQ(summary["tissue_fraction"], synthetic()["tissue_fraction"]);
  EXPECT_EQ(summary["level0_tissue_tiles"], synthetic()["level0_tissue_tiles"]);
  nlohmann::json annotations = nlohmann::json::parse(std::ifstream(geojson_path));
  EXPECT_EQ(annotations["type"], "FeatureCollection");
  EXPECT_EQ(annotations["features"], nlohmann::json::array());
  auto mask = open_labels(mask_path.string(), 3072, 2048, labelling(LabelRule::coverage, 0.01));
  auto geojson = open_labels(geojson_path.string(), 3072, 2048, labelling(LabelRule::coverage, 0.01, "Normal"));
  auto sparse = open_labels(geojson_path.string(), 3072, 2048, labelling(LabelRule::coverage, 0.01));
  for (int y = 0; y < 2048; y += 256)
    for (int x = 0; x < 3072; x += 256) {
      EXPECT_EQ(mask->label(x, y, x + 256, y + 256), 0u) << x << "," << y;
      EXPECT_EQ(geojson->label(x, y, x + 256, y + 256), 0u) << x << "," << y;
      EXPECT_EQ(sparse->label(x, y, x + 256, y + 256), left_out) << x << "," << y;
    }
}

// Channel 256 of level 0 and channel 0 of level 1 shared a key before (the channel had 8 bits
// beside the level); so did row 2^24 and channel 1. Every key is now whole: no two tiles meet.
TEST(Slide, DecodedTileKeysNeverCollide) {
  TileCache cache(uint64_t{1} << 20);
  auto pixels = [](uint8_t value) { return std::make_shared<const std::vector<uint8_t>>(4, value); };
  const std::vector<TileCache::Key> keys{{0, 256, 0, 0},       {1, 0, 0, 0},         {0, 1, 0, 0},
                                         {0, 0, int64_t{1} << 24, 0}, {0, 0, 0, int64_t{1} << 24},
                                         {0, 0, 1, 0},         {0, 0, 0, 1},         {0, 0, int64_t{1} << 28, 0}};
  for (size_t i = 0; i < keys.size(); ++i) cache.insert(keys[i], pixels(static_cast<uint8_t>(i)));
  for (size_t i = 0; i < keys.size(); ++i) {
    auto found = cache.find(keys[i]);
    ASSERT_TRUE(found) << i;
    EXPECT_EQ((*found)[0], i) << i;
  }
  EXPECT_FALSE(cache.find({0, 255, 0, 0}));
}

TEST(BadInput, MissingSlide) {
  auto message = bad_input_message([] { open_slide((directory() / "absent.tiff").string()); });
  EXPECT_NE(message.find("absent.tiff: no such slide"), std::string::npos) << message;
}

TEST(BadInput, TruncatedTiff) {
  auto truncated = directory() / "truncated.tiff";
  fs::copy_file(slide_path(), truncated, fs::copy_options::overwrite_existing);
  // Keep the first directory (written after level 0's tiles) but cut into level 0's last tiles.
  TIFF* tiff = TIFFOpen(truncated.c_str(), "r");
  ASSERT_NE(tiff, nullptr);
  uint64_t* offsets = nullptr;
  ASSERT_TRUE(TIFFGetField(tiff, TIFFTAG_TILEOFFSETS, &offsets));
  uint64_t cut = offsets[TIFFNumberOfTiles(tiff) - 2];
  TIFFClose(tiff);
  fs::resize_file(truncated, cut);
  auto message = bad_input_message([&] { open_slide(truncated.string()); });
  EXPECT_NE(message.find("truncated.tiff"), std::string::npos) << message;
}

TEST(Slide, StrippedTiffIsReadThroughLibvips) {
  auto path = directory() / "stripped.tiff";
  TIFF* tiff = TIFFOpen(path.c_str(), "w");
  ASSERT_NE(tiff, nullptr);
  TIFFSetField(tiff, TIFFTAG_IMAGEWIDTH, 64);
  TIFFSetField(tiff, TIFFTAG_IMAGELENGTH, 64);
  TIFFSetField(tiff, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(tiff, TIFFTAG_SAMPLESPERPIXEL, 3);
  TIFFSetField(tiff, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_RGB);
  TIFFSetField(tiff, TIFFTAG_ROWSPERSTRIP, 16);
  std::vector<uint8_t> row(64 * 3, 200);
  for (uint32_t y = 0; y < 64; ++y) TIFFWriteScanline(tiff, row.data(), y, 0);
  TIFFClose(tiff);
  auto slide = open_slide(path.string());
  EXPECT_EQ(slide->format(), "vips:tiffload");
  ASSERT_EQ(slide->levels().size(), 1u);
  EXPECT_EQ(slide->levels()[0].width, 64);
  std::vector<uint8_t> rgb(32 * 32 * 3);
  slide->read_region(0, 48, 0, 32, 32, rgb.data());
  EXPECT_EQ(rgb[0], 200) << "inside the image";
  EXPECT_EQ(rgb[(31 * 32 + 31) * 3], 255) << "beyond the image: white";
  auto message = bad_input_message([&] { open_slide(path.string(), 1 << 20, SlideReader::libtiff); });
  EXPECT_NE(message.find("stripped.tiff: not a tiled TIFF"), std::string::npos) << message;
}

TEST(BadInput, NotASlideAtAll) {
  auto path = directory() / "notes.txt";
  write_text(path, "hello");
  auto message = bad_input_message([&] { open_slide(path.string()); });
  EXPECT_NE(message.find("notes.txt"), std::string::npos) << message;
}

TEST(BadInput, InvalidGeoJson) {
  auto broken = directory() / "broken.geojson";
  write_text(broken, R"({"type":"FeatureCollection","features":[{"type":"Feature")");
  auto message = bad_input_message([&] { open_labels(broken.string(), 100, 100, LabelOptions{}); });
  EXPECT_NE(message.find("broken.geojson: not valid JSON"), std::string::npos) << message;
  auto wrong = directory() / "wrong.geojson";
  write_text(wrong, R"({"type":"FeatureCollection","features":[{"type":"Feature","properties":{"classification":
    {"name":"Tumor"}},"geometry":{"type":"Polygon","coordinates":[[[0,0],[1,"a"],[1,1],[0,0]]]}}]})");
  message = bad_input_message([&] { open_labels(wrong.string(), 100, 100, LabelOptions{}); });
  EXPECT_NE(message.find("wrong.geojson: feature 0: a position is not [x, y]"), std::string::npos) << message;
}

TEST(BadInput, CorruptJpegTileIsNamedCountedAndSkipped) {
  auto corrupt = directory() / "corrupt.tiff";
  fs::copy_file(slide_path(), corrupt, fs::copy_options::overwrite_existing);
  // Find a tissue tile in the middle of level 0 and scramble its entropy-coded data.
  auto slide = open_slide(corrupt.string());
  TissueMask tissue(*slide, 256);
  int64_t column = 0, row = 0;
  double most = 0;
  for (int64_t r = 2; r < 6; ++r)
    for (int64_t c = 2; c < 10; ++c)
      if (double fraction = tissue.tissue_fraction(c * 256.0, r * 256.0, c * 256.0 + 256, r * 256.0 + 256);
          fraction > most) {
        most = fraction;
        column = c;
        row = r;
      }
  ASSERT_GT(column, 0);
  slide.reset();
  TIFF* tiff = TIFFOpen(corrupt.c_str(), "r");
  uint64_t *offsets = nullptr, *counts = nullptr;
  TIFFGetField(tiff, TIFFTAG_TILEOFFSETS, &offsets);
  TIFFGetField(tiff, TIFFTAG_TILEBYTECOUNTS, &counts);
  uint64_t offset = offsets[row * 12 + column], count = counts[row * 12 + column];
  TIFFClose(tiff);
  {
    std::fstream file(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(offset + count / 2));
    std::string garbage(64, '\xff');
    for (size_t i = 1; i < garbage.size(); i += 2) garbage[i] = static_cast<char>(0xd0 + i % 8);
    file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  std::string name = "level 0 tile column " + std::to_string(column) + " row " + std::to_string(row);
  slide = open_slide(corrupt.string());
  std::vector<uint8_t> rgb(256 * 256 * 3);
  auto message = bad_input_message([&] { slide->read_region(0, column * 256, row * 256, 256, 256, rgb.data()); });
  EXPECT_NE(message.find("corrupt.tiff: " + name + ": corrupt JPEG"), std::string::npos) << message;

  for (auto encoding : {TileEncoding::jpeg, TileEncoding::raw}) {
    auto store = directory() / (encoding == TileEncoding::jpeg ? "corrupt_jpeg.lmdb" : "corrupt_raw.lmdb");
    fs::remove_all(store);
    TilerOptions options;
    options.encoding = encoding;
    options.workers = 2;
    auto summary = tile_slides({{corrupt.string(), ""}}, store.string(), options);
    auto& result = summary["slides"][0];
    EXPECT_EQ(result["corrupt_tiles"], 1);
    EXPECT_EQ(result["written"].get<int>(), result["candidates"].get<int>() - 1);
    EXPECT_GT(result["written"].get<int>(), 5);
    EXPECT_EQ(open_tile_store(store.string())->size(), result["written"].get<size_t>());
  }
}

TEST(Tiler, CopiesFileJpegsAndLabelsTumourTiles) {
  auto store = directory() / "tiles.lmdb";
  fs::remove_all(store);
  TilerOptions options;
  options.workers = 2;
  options.labelling.unannotated = "Normal";  // the synthetic GeoJSON outlines every tumour
  auto summary = tile_slides({{slide_path(), (directory() / "slide.geojson").string()}}, store.string(), options);
  auto& result = summary["slides"][0];
  int written = result["written"];
  EXPECT_EQ(result["unannotated"], 0);
  EXPECT_EQ(result["copied_jpeg"], written) << "256-pixel tiles at level 0 match the file's tiles";
  EXPECT_EQ(result["grid"], nlohmann::json::parse("[12, 8]"));
  // About the tissue area in tiles (tiles at least half tissue).
  double expected = synthetic()["tissue_fraction"].get<double>() * 96;
  EXPECT_NEAR(written, expected, 0.25 * expected);
  EXPECT_GT(result["label_counts"].value("1", 0), 0);

  // Tiled again: nothing to do. Tiled at level 1 into raw 128-pixel tiles: decoded and cut.
  auto again = tile_slides({{slide_path(), (directory() / "slide.geojson").string()}}, store.string(), options);
  EXPECT_EQ(again["slides"][0]["status"], "already complete");
  auto raw_store = directory() / "raw.lmdb";
  fs::remove_all(raw_store);
  options.encoding = TileEncoding::raw;
  options.size = 128;
  options.level = 1;
  auto raw = tile_slides({{slide_path(), (directory() / "slide.mask.tiff").string()}}, raw_store.string(), options);
  EXPECT_EQ(raw["slides"][0]["copied_jpeg"], 0);
  EXPECT_EQ(raw["slides"][0]["grid"], nlohmann::json::parse("[12, 8]"));
  auto patches = open_tile_store(raw_store.string());
  EXPECT_EQ(patches->width(), 128);
  EXPECT_EQ(patches->size(), raw["slides"][0]["written"].get<size_t>());
}
