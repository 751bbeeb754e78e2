// DICOM VL Whole Slide Microscopy images through DCMTK: each VOLUME instance of the series is a
// level, its frames the tiles of a TILED_FULL matrix. JPEG baseline frames are decoded (and
// copied) with libturbojpeg; other transfer syntaxes DCMTK decodes (uncompressed, RLE, JPEG
// lossless, JPEG-LS) through its codecs. JPEG 2000 is refused: Debian's DCMTK has no decoder.
#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcpixel.h>
#include <dcmtk/dcmdata/dcpixseq.h>
#include <dcmtk/dcmdata/dcpxitem.h>
#include <dcmtk/dcmdata/dcrledrg.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmdata/dcxfer.h>
#include <dcmtk/dcmjpeg/djdecode.h>
#include <dcmtk/dcmjpls/djdecode.h>

#include <array>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/library_warnings.h"
#include "data/jpeg.h"
#include "data/slide_parts.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

void register_codecs() {
  static std::once_flag once;
  std::call_once(once, [] {
    DcmRLEDecoderRegistration::registerCodecs();
    DJDecoderRegistration::registerCodecs();
    DJLSDecoderRegistration::registerCodecs();
  });
}

// One VOLUME instance: a level.
struct Instance {
  std::string path;
  std::unique_ptr<DcmFileFormat> file;
  DcmPixelData* pixels = nullptr;
  DcmPixelSequence* fragments = nullptr;  // JPEG baseline, one fragment per frame; else null
  SlideLevel shape;
  int64_t columns = 0, rows = 0;  // frames across and down
  double spacing_x = 0, spacing_y = 0;  // millimetres per pixel
};

std::string text_of(DcmItem& item, const DcmTagKey& tag) {
  OFString value;
  return item.findAndGetOFStringArray(tag, value).good() ? std::string(value.c_str()) : std::string();
}

// Header and structure of one file; pixel data stays on disk until a frame is read.
Instance load_instance(const std::string& path) {
  Instance instance;
  instance.path = path;
  instance.file = std::make_unique<DcmFileFormat>();
  if (OFCondition status = instance.file->loadFile(path.c_str(), EXS_Unknown, EGL_noChange, 4096); status.bad())
    throw BadInput(path + ": DCMTK cannot read it: " + status.text());
  return instance;
}

void describe_level(Instance& instance) {
  DcmDataset& data = *instance.file->getDataset();
  const std::string& path = instance.path;
  Uint32 total_columns = 0, total_rows = 0;
  Uint16 columns = 0, rows = 0, samples = 0, bits = 0;
  Sint32 frames = 1;
  data.findAndGetUint32(DCM_TotalPixelMatrixColumns, total_columns);
  data.findAndGetUint32(DCM_TotalPixelMatrixRows, total_rows);
  data.findAndGetUint16(DCM_Columns, columns);
  data.findAndGetUint16(DCM_Rows, rows);
  data.findAndGetUint16(DCM_SamplesPerPixel, samples);
  data.findAndGetUint16(DCM_BitsAllocated, bits);
  data.findAndGetSint32(DCM_NumberOfFrames, frames);
  if (!total_columns || !total_rows || !columns || !rows)
    throw BadInput(path + ": no total pixel matrix or frame size");
  if (columns > max_tile_side || rows > max_tile_side)
    throw BadInput(path + ": frames of " + std::to_string(columns) + "x" + std::to_string(rows) +
                   " pixels; tessera reads frames of at most " + std::to_string(max_tile_side) +
                   " a side (a corrupt file?)");
  if (samples != 3 || bits != 8)
    throw BadInput(path + ": " + std::to_string(samples) + " samples of " + std::to_string(bits) +
                   " bits; tessera reads 8-bit RGB (bright-field) slides");
  std::string organisation = text_of(data, DCM_DimensionOrganizationType);
  if (frames > 1 && organisation != "TILED_FULL")
    throw BadInput(path + ": dimension organisation '" + organisation + "'; tessera reads TILED_FULL");
  if (!text_of(data, DCM_ConcatenationUID).empty())
    throw BadInput(path + ": a concatenation (a level split over several files) is not supported");
  std::string focal_planes = text_of(data, DCM_TotalPixelMatrixFocalPlanes);
  std::string optical_paths = text_of(data, DCM_NumberOfOpticalPaths);
  if ((!focal_planes.empty() && focal_planes != "1") || (!optical_paths.empty() && optical_paths != "1"))
    throw BadInput(path + ": " + focal_planes + " focal planes and " + optical_paths +
                   " optical paths; tessera reads one of each");
  instance.shape = {total_columns, total_rows, 1.0, columns, rows};
  instance.columns = (int64_t{total_columns} + columns - 1) / columns;
  instance.rows = (int64_t{total_rows} + rows - 1) / rows;
  if (frames < 1 || instance.columns > frames || instance.rows > frames / instance.columns)
    throw BadInput(path + ": " + std::to_string(frames) + " frames, a TILED_FULL matrix of " +
                   std::to_string(instance.columns) + "x" + std::to_string(instance.rows) + " needs more");
  DcmItem* shared = nullptr;
  DcmItem* measures = nullptr;
  if (data.findAndGetSequenceItem(DCM_SharedFunctionalGroupsSequence, shared, 0).good() &&
      shared->findAndGetSequenceItem(DCM_PixelMeasuresSequence, measures, 0).good()) {
    Float64 row_spacing = 0, column_spacing = 0;
    if (measures->findAndGetFloat64(DCM_PixelSpacing, row_spacing, 0).good() &&
        measures->findAndGetFloat64(DCM_PixelSpacing, column_spacing, 1).good()) {
      instance.spacing_x = column_spacing;
      instance.spacing_y = row_spacing;
    }
  }
  DcmElement* element = nullptr;
  if (data.findAndGetElement(DCM_PixelData, element).bad() || !element)
    throw BadInput(path + ": no pixel data");
  instance.pixels = static_cast<DcmPixelData*>(element);
  DcmXfer syntax(data.getOriginalXfer());
  std::string uid = syntax.getXferID();
  // Native frames are the element's bytes: they must all be there (a truncated file is cut here).
  uint64_t frame_bytes = uint64_t{columns} * rows * 3, file_size = fs::file_size(path);
  if (!syntax.isEncapsulated() && (instance.pixels->getLength() < frame_bytes * static_cast<uint64_t>(frames) ||
                                   instance.pixels->getLength() > file_size))
    throw BadInput(path + ": truncated or corrupt: its pixel data holds " +
                   std::to_string(instance.pixels->getLength()) + " bytes, its " + std::to_string(frames) +
                   " frames need " + std::to_string(frame_bytes * static_cast<uint64_t>(frames)) + " (the file has " +
                   std::to_string(file_size) + ")");
  if (uid.rfind("1.2.840.10008.1.2.4.9", 0) == 0 || uid.rfind("1.2.840.10008.1.2.4.20", 0) == 0)
    throw BadInput(path + ": JPEG 2000 frames (" + syntax.getXferName() + "): DCMTK here cannot decode them");
  if (uid == UID_JPEGProcess1TransferSyntax) {
    DcmPixelSequence* sequence = nullptr;
    if (instance.pixels->getEncapsulatedRepresentation(data.getOriginalXfer(), nullptr, sequence).bad() || !sequence)
      throw BadInput(path + ": JPEG pixel data without fragments");
    // Item 0 is the offset table; one fragment per frame is what WSI writers produce.
    if (sequence->card() == static_cast<unsigned long>(frames) + 1) instance.fragments = sequence;
  }
}

class DicomSlide final : public Slide {
 public:
  explicit DicomSlide(const std::string& path) : path_(path) {
    register_codecs();
    Instance first = load_instance(path);
    DcmDataset& data = *first.file->getDataset();
    std::string sop_class = text_of(data, DCM_SOPClassUID);
    if (sop_class != UID_VLWholeSlideMicroscopyImageStorage)
      throw BadInput(path + ": a DICOM file but not a whole-slide image (SOP class " + sop_class + ")");
    std::string series = text_of(data, DCM_SeriesInstanceUID);
    std::vector<Instance> found;
    if (is_volume(data)) found.push_back(std::move(first));
    std::error_code error;
    for (auto& entry : fs::directory_iterator(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path(),
                                              error)) {
      if (!entry.is_regular_file() || fs::equivalent(entry.path(), path, error) ||
          !has_dicom_signature(entry.path().string()))
        continue;
      Instance other = load_instance(entry.path().string());
      DcmDataset& other_data = *other.file->getDataset();
      if (text_of(other_data, DCM_SeriesInstanceUID) == series && is_volume(other_data)) found.push_back(std::move(other));
    }
    if (found.empty()) throw BadInput(path + ": its series has no VOLUME image (only labels, overviews, thumbnails)");
    for (auto& instance : found) describe_level(instance);
    std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.shape.width > b.shape.width; });
    for (auto& instance : found) {
      instance.shape.downsample = 0.5 * (static_cast<double>(found[0].shape.width) / instance.shape.width +
                                         static_cast<double>(found[0].shape.height) / instance.shape.height);
      shapes_.push_back(instance.shape);
    }
    check_levels_nest(path, shapes_);
    mpp_x_ = found[0].spacing_x * 1000;
    mpp_y_ = found[0].spacing_y * 1000;
    levels_ = std::move(found);
  }

  const std::string& path() const override { return path_; }
  std::string format() const override { return "dicom"; }
  const std::vector<SlideLevel>& levels() const override { return shapes_; }
  double mpp_x() const override { return mpp_x_; }
  double mpp_y() const override { return mpp_y_; }

  void read_region(int level_index, int64_t x, int64_t y, int width, int height, uint8_t* rgb) const override {
    const Instance& level = levels_.at(static_cast<size_t>(level_index));
    const LibraryFileScope scope(level.path);  // what DCMTK logs names the file
    std::memset(rgb, 255, static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
    int tile_width = level.shape.tile_width, tile_height = level.shape.tile_height;
    int64_t last_column = std::min<int64_t>(level.columns - 1, (x + width - 1) / tile_width);
    int64_t last_row = std::min<int64_t>(level.rows - 1, (y + height - 1) / tile_height);
    std::vector<uint8_t> frame(static_cast<size_t>(tile_width) * tile_height * 3);
    for (int64_t row = std::max<int64_t>(0, y / tile_height); row <= last_row; ++row)
      for (int64_t column = std::max<int64_t>(0, x / tile_width); column <= last_column; ++column) {
        decode_frame(level, level_index, column, row, frame.data());
        copy_overlap(frame.data(), column * tile_width, row * tile_height, tile_width, tile_height, x, y, width, height,
                     rgb);
      }
  }

  std::optional<std::vector<uint8_t>> jpeg_tile(int level_index, int64_t column, int64_t row) const override {
    const Instance& level = levels_.at(static_cast<size_t>(level_index));
    if (!level.fragments) return std::nullopt;
    return fragment(level, level_index, column, row);
  }

 private:
  static bool is_volume(DcmDataset& data) {
    std::string type = text_of(data, DCM_ImageType);
    return type.find("VOLUME") != std::string::npos;
  }

  std::vector<uint8_t> fragment(const Instance& level, int level_index, int64_t column, int64_t row) const {
    std::lock_guard lock(mutex_);
    DcmPixelItem* item = nullptr;
    Uint8* bytes = nullptr;
    unsigned long index = static_cast<unsigned long>(row * level.columns + column) + 1;
    if (level.fragments->getItem(item, index).bad() || item->getUint8Array(bytes).bad() || !bytes)
      throw BadInput(level.path + ": " + tile_name(level_index, column, row) + ": cannot read its frame");
    std::vector<uint8_t> jpeg(bytes, bytes + item->getLength());
    item->compact();  // frames are read from the file again when needed, not kept
    return jpeg;
  }

  void decode_frame(const Instance& level, int level_index, int64_t column, int64_t row, uint8_t* rgb) const {
    int tile_width = level.shape.tile_width, tile_height = level.shape.tile_height;
    if (level.fragments) {
      auto jpeg = fragment(level, level_index, column, row);
      if (auto problem = decode_jpeg(jpeg.data(), jpeg.size(), tile_width, tile_height, rgb); !problem.empty())
        throw BadInput(level.path + ": " + tile_name(level_index, column, row) + ": corrupt JPEG: " + problem);
      return;
    }
    std::lock_guard lock(mutex_);
    Uint32 start_fragment = 0;
    OFString colour;
    size_t bytes = static_cast<size_t>(tile_width) * tile_height * 3;
    std::vector<uint8_t> buffer(bytes + 1);  // DCMTK wants room for a pad byte
    OFCondition status = level.pixels->getUncompressedFrame(
        level.file->getDataset(), static_cast<Uint32>(row * level.columns + column), start_fragment, buffer.data(),
        static_cast<Uint32>(buffer.size()), colour, nullptr);
    if (status.bad())
      throw BadInput(level.path + ": " + tile_name(level_index, column, row) + ": DCMTK: " + status.text());
    if (colour != "RGB")
      throw BadInput(level.path + ": frames in colour model " + std::string(colour.c_str()) + ", not RGB");
    std::memcpy(rgb, buffer.data(), bytes);
  }

  std::string path_;
  std::vector<Instance> levels_;
  std::vector<SlideLevel> shapes_;
  double mpp_x_ = 0, mpp_y_ = 0;
  mutable std::mutex mutex_;  // DCMTK's objects are not safe from several threads
};

}  // namespace

bool has_dicom_signature(const std::string& path) {
  std::array<char, 132> head{};
  std::ifstream file(path, std::ios::binary);
  return file.read(head.data(), head.size()) && std::string(head.data() + 128, 4) == "DICM";
}

std::unique_ptr<Slide> open_dicom_slide(const std::string& path) { return std::make_unique<DicomSlide>(path); }

}  // namespace tessera::data
