#include "data/format_checks.h"

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dccodec.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcpixel.h>
#include <dcmtk/dcmdata/dcpixseq.h>
#include <dcmtk/dcmdata/dcpxitem.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <fcntl.h>
#include <openslide/openslide.h>
#include <tiffio.h>
#include <vips/vips.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>

#include "data/jpeg.h"
#include "data/png.h"
#include "data/slide.h"
#include "data/synthetic_slide.h"

namespace tessera::data {

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kCacheBytes = uint64_t{4} << 20;

void require(bool holds, const std::string& what) {
  if (!holds) throw std::runtime_error(what);
}

std::vector<uint8_t> read_level0(const Slide& slide, int width, int height) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * static_cast<size_t>(height) *
                              static_cast<size_t>(slide.channels()));
  slide.read_region(0, 0, 0, width, height, pixels.data());
  return pixels;
}

int largest_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int largest = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) largest = std::max(largest, std::abs(a[i] - b[i]));
  return largest;
}

// Runs `check` into `result`: available when it returns, else the problem it threw.
FormatCheck run_check(FormatCheck result, const std::function<void()>& check) {
  try {
    check();
    result.available = true;
  } catch (const std::exception& e) {
    result.problem = e.what();
  }
  return result;
}

// "libtiff 4.5.0": TIFFGetVersion's first line is "LIBTIFF, Version 4.5.0", then its copyright.
std::string libtiff_version() {
  std::string text = TIFFGetVersion();
  text = text.substr(0, text.find('\n'));
  const size_t number = text.find("Version ");
  return "libtiff " + (number == std::string::npos ? text : text.substr(number + 8));
}

// A synthetic slide written without its progress bar (stderr): that is `tessera synth`'s, not
// the doctor's.
void write_quietly(const SyntheticSlideOptions& options, const SyntheticSlidePaths& paths) {
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (saved >= 0 && null >= 0) dup2(null, STDERR_FILENO);
  if (null >= 0) close(null);
  auto restore = [saved] {
    std::fflush(stderr);
    if (saved < 0) return;
    dup2(saved, STDERR_FILENO);
    close(saved);
  };
  try {
    write_synthetic_slide(options, paths);
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

SyntheticSlidePaths synthetic_paths(const fs::path& scratch, const std::string& name) {
  return {(scratch / (name + ".tiff")).string(), (scratch / (name + ".mask.tiff")).string(),
          (scratch / (name + ".geojson")).string()};
}

// A DICOM VL Whole Slide Microscopy image of 2 x 2 frames of 32 pixels, each a flat colour,
// as JPEG baseline (what scanners write): one VOLUME instance, so one level.
constexpr int kFrameSide = 32;
constexpr std::array<std::array<uint8_t, 3>, 4> kFrameColours = {
    {{200, 60, 40}, {40, 200, 60}, {60, 40, 200}, {230, 230, 230}}};

void write_dicom(const std::string& path) {
  DcmFileFormat file;
  DcmDataset& data = *file.getDataset();
  char uid[100];
  auto put = [&](const DcmTagKey& tag, const std::string& value) {
    if (data.putAndInsertString(tag, value.c_str()).bad()) throw std::runtime_error("DCMTK cannot set a tag");
  };
  put(DCM_SOPClassUID, UID_VLWholeSlideMicroscopyImageStorage);
  put(DCM_SOPInstanceUID, dcmGenerateUniqueIdentifier(uid, SITE_INSTANCE_UID_ROOT));
  put(DCM_StudyInstanceUID, dcmGenerateUniqueIdentifier(uid, SITE_STUDY_UID_ROOT));
  put(DCM_SeriesInstanceUID, dcmGenerateUniqueIdentifier(uid, SITE_SERIES_UID_ROOT));
  put(DCM_Modality, "SM");
  put(DCM_ImageType, "ORIGINAL\\PRIMARY\\VOLUME\\NONE");
  put(DCM_PhotometricInterpretation, "YBR_FULL_422");
  put(DCM_DimensionOrganizationType, "TILED_FULL");
  put(DCM_NumberOfFrames, std::to_string(kFrameColours.size()));
  data.putAndInsertUint16(DCM_Rows, kFrameSide);
  data.putAndInsertUint16(DCM_Columns, kFrameSide);
  data.putAndInsertUint32(DCM_TotalPixelMatrixColumns, 2 * kFrameSide);
  data.putAndInsertUint32(DCM_TotalPixelMatrixRows, 2 * kFrameSide);
  data.putAndInsertUint16(DCM_SamplesPerPixel, 3);
  data.putAndInsertUint16(DCM_PlanarConfiguration, 0);
  data.putAndInsertUint16(DCM_BitsAllocated, 8);
  data.putAndInsertUint16(DCM_BitsStored, 8);
  data.putAndInsertUint16(DCM_HighBit, 7);
  data.putAndInsertUint16(DCM_PixelRepresentation, 0);
  DcmItem* shared = nullptr;
  DcmItem* measures = nullptr;
  if (data.findOrCreateSequenceItem(DCM_SharedFunctionalGroupsSequence, shared, 0).bad() ||
      shared->findOrCreateSequenceItem(DCM_PixelMeasuresSequence, measures, 0).bad() ||
      measures->putAndInsertString(DCM_PixelSpacing, "0.0005\\0.0005").bad())
    throw std::runtime_error("DCMTK cannot set the pixel spacing");
  auto pixels = std::make_unique<DcmPixelData>(DCM_PixelData);
  auto* sequence = new DcmPixelSequence(DCM_PixelSequenceTag);  // owned by the pixel data once put
  sequence->insert(new DcmPixelItem(DCM_PixelItemTag));         // the (empty) offset table
  DcmOffsetList offsets;
  for (const auto& colour : kFrameColours) {
    std::vector<uint8_t> frame(kFrameSide * kFrameSide * 3);
    for (size_t i = 0; i < frame.size(); ++i) frame[i] = colour[i % 3];
    std::vector<uint8_t> jpeg = encode_jpeg(frame.data(), kFrameSide, kFrameSide, 95);
    if (sequence->storeCompressedFrame(offsets, jpeg.data(), static_cast<Uint32>(jpeg.size()), 0).bad())
      throw std::runtime_error("DCMTK cannot store a frame");
  }
  pixels->putOriginalRepresentation(EXS_JPEGProcess1, nullptr, sequence);
  if (data.insert(pixels.release()).bad()) throw std::runtime_error("DCMTK cannot add the pixel data");
  if (OFCondition status = file.saveFile(path.c_str(), EXS_JPEGProcess1); status.bad())
    throw std::runtime_error("DCMTK cannot write " + path + ": " + status.text());
}

void check_dicom(const fs::path& scratch) {
  const std::string path = (scratch / "dicom" / "level0.dcm").string();
  fs::create_directories(scratch / "dicom");
  write_dicom(path);
  auto slide = open_slide(path, kCacheBytes);
  require(slide->format() == "dicom", "read as " + slide->format() + ", not as DICOM");
  require(std::abs(slide->mpp_x() - 0.5) < 1e-9, "its pixel spacing read as " + std::to_string(slide->mpp_x()) +
                                                     " um, not 0.5");
  auto pixels = read_level0(*slide, 2 * kFrameSide, 2 * kFrameSide);
  int largest = 0;
  for (int y = 0; y < 2 * kFrameSide; ++y)
    for (int x = 0; x < 2 * kFrameSide; ++x)
      for (int c = 0; c < 3; ++c) {
        const auto& colour = kFrameColours[static_cast<size_t>((y / kFrameSide) * 2 + x / kFrameSide)];
        largest = std::max(largest, std::abs(pixels[static_cast<size_t>((y * 2 * kFrameSide + x) * 3 + c)] - colour[c]));
      }
  // A flat 32-pixel JPEG at quality 95 decodes within a few levels of its colour.
  require(largest <= 8, "its frames decode up to " + std::to_string(largest) + " levels off the colours written");
}

// An Aperio SVS of one 64x64 tile whose data is a lossless JPEG 2000 codestream (compression
// 33005: RGB), encoded by libvips' OpenJPEG and read through OpenSlide, every pixel compared.
void check_jpeg2000_svs(const fs::path& scratch) {
  constexpr int side = 64;
  std::vector<uint8_t> written(side * side * 3);
  for (size_t i = 0; i < written.size(); ++i) written[i] = static_cast<uint8_t>(i * 13 % 251);
  if (VIPS_INIT("tessera")) throw std::runtime_error("libvips cannot start");
  VipsImage* image = vips_image_new_from_memory(written.data(), written.size(), side, side, 3, VIPS_FORMAT_UCHAR);
  require(image != nullptr, "libvips cannot wrap the pixels");
  void* codestream = nullptr;
  size_t length = 0;
  const int failed = vips_jp2ksave_buffer(image, &codestream, &length, "lossless", TRUE, nullptr);
  g_object_unref(image);
  require(failed == 0, "libvips cannot encode JPEG 2000 (built without OpenJPEG?)");
  std::unique_ptr<void, void (*)(void*)> owned(codestream, g_free);
  // libvips writes a JP2 file; an SVS tile holds the bare codestream, its "jp2c" box.
  const auto* bytes = static_cast<const uint8_t*>(codestream);
  size_t at = 0, begin = 0, end = 0;
  while (at + 8 <= length && end == 0) {
    const size_t box = size_t{bytes[at]} << 24 | size_t{bytes[at + 1]} << 16 | size_t{bytes[at + 2]} << 8 | bytes[at + 3];
    const bool last = box == 0;  // to the end of the file
    if (std::string(reinterpret_cast<const char*>(bytes + at + 4), 4) == "jp2c") {
      begin = at + 8;
      end = last ? length : std::min(length, at + box);
    }
    if (last || box < 8) break;
    at += box;
  }
  require(end > begin, "libvips' JPEG 2000 file has no codestream box");
  const std::string path = (scratch / "jpeg2000.svs").string();
  TIFF* tiff = TIFFOpen(path.c_str(), "w");
  require(tiff != nullptr, "libtiff cannot write " + path);
  constexpr uint16_t kAperioJpeg2000Rgb = 33005;
  TIFFSetField(tiff, TIFFTAG_IMAGEWIDTH, side);
  TIFFSetField(tiff, TIFFTAG_IMAGELENGTH, side);
  TIFFSetField(tiff, TIFFTAG_TILEWIDTH, side);
  TIFFSetField(tiff, TIFFTAG_TILELENGTH, side);
  TIFFSetField(tiff, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(tiff, TIFFTAG_SAMPLESPERPIXEL, 3);
  TIFFSetField(tiff, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_RGB);
  TIFFSetField(tiff, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(tiff, TIFFTAG_COMPRESSION, kAperioJpeg2000Rgb);
  TIFFSetField(tiff, TIFFTAG_IMAGEDESCRIPTION,
               "Aperio Image Library v11.2.1\r\n64x64 [0,0 64x64] (64x64) J2K/KDU Q=100|AppMag = 20|MPP = 0.5");
  const bool stored = TIFFWriteRawTile(tiff, 0, const_cast<uint8_t*>(bytes + begin), static_cast<tmsize_t>(end - begin)) != -1;
  TIFFClose(tiff);
  require(stored, "libtiff cannot write a JPEG 2000 tile to " + path);
  auto slide = open_slide(path, kCacheBytes, SlideReader::openslide);
  require(slide->format().rfind("openslide:", 0) == 0, "read as " + slide->format());
  const int largest = largest_difference(read_level0(*slide, side, side), written);
  require(largest == 0, "its lossless JPEG 2000 pixels read back up to " + std::to_string(largest) + " levels off");
}

}  // namespace

std::vector<FormatCheck> check_slide_formats(const std::string& scratch_directory) {
  const fs::path scratch(scratch_directory);
  std::vector<FormatCheck> checks;
  // A bright-field pyramid as `tessera synth` writes it: JPEG tiles in a BigTIFF.
  const SyntheticSlidePaths bright = synthetic_paths(scratch, "brightfield");
  const int side = 512;
  std::vector<uint8_t> tiff_pixels;
  checks.push_back(run_check(
      {"TIFF / BigTIFF", libtiff_version(), "a 512x512 JPEG-tiled BigTIFF (tessera synth) "
                                                                     "written and read back"},
      [&] {
        SyntheticSlideOptions options;
        options.width = options.height = side;
        options.seed = 1;
        options.mpp = 0.5;
        write_quietly(options, bright);
        auto slide = open_slide(bright.slide, kCacheBytes);
        require(slide->format() == "tiff", "read as " + slide->format() + ", not by libtiff");
        require(std::abs(slide->mpp_x() - 0.5) < 1e-6, "its resolution read as " + std::to_string(slide->mpp_x()) +
                                                           " um a pixel, not 0.5");
        require(slide->jpeg_tile(0, 0, 0).has_value(), "its JPEG tiles are not handed out whole");
        tiff_pixels = read_level0(*slide, side, side);
      }));
  checks.push_back(run_check(
      {"OpenSlide (SVS, NDPI, MRXS, SCN, ...)", std::string("OpenSlide ") + openslide_get_version(),
       "the same BigTIFF read through OpenSlide (in its probe child, as every vendor slide is), pixels compared "
       "with libtiff's"},
      [&] {
        require(!tiff_pixels.empty(), "no TIFF to compare with (libtiff's check failed)");
        auto slide = open_slide(bright.slide, kCacheBytes, SlideReader::openslide);
        require(slide->format().rfind("openslide:", 0) == 0, "read as " + slide->format());
        int largest = largest_difference(read_level0(*slide, side, side), tiff_pixels);
        // Both decode with libjpeg-turbo: the same pixels, give or take an IDCT's rounding.
        require(largest <= 2, "its pixels differ from libtiff's by up to " + std::to_string(largest) + " levels");
      }));
  checks.push_back(run_check(
      {"OME-TIFF (multiplex planes; QPTIFF alike)", libtiff_version(),
       "a 4-channel fluorescence OME-TIFF (tessera synth) written and read back"},
      [&] {
        SyntheticSlideOptions options;
        options.width = options.height = side;
        options.seed = 1;
        options.fluorescence = true;
        options.channels = 4;
        const SyntheticSlidePaths planes = synthetic_paths(scratch, "multiplex");
        write_quietly(options, planes);
        auto slide = open_slide(planes.slide, kCacheBytes);
        require(slide->format() == "ome-tiff", "read as " + slide->format() + ", not as OME-TIFF");
        require(slide->channels() == 4 && !slide->rgb() && slide->channel_names().size() == 4,
                "read as " + std::to_string(slide->channels()) + " channels, not the 4 named planes written");
        auto pixels = read_level0(*slide, side, side);
        require(std::any_of(pixels.begin(), pixels.end(), [](uint8_t v) { return v != 0; }), "its planes read as black");
      }));
  checks.push_back(run_check({"DICOM (VL Whole Slide Microscopy)", std::string("DCMTK ") + OFFIS_DCMTK_VERSION_STRING,
                              "a JPEG-baseline series of 2x2 frames written with DCMTK and read back"},
                             [&] { check_dicom(scratch); }));
  // After the DICOM check DCMTK's decoders are registered: ask it, rather than a list.
  FormatCheck dicom_j2k{"JPEG 2000 in DICOM", std::string("DCMTK ") + OFFIS_DCMTK_VERSION_STRING,
                        "asked DCMTK for a JPEG 2000 decoder", false, false, ""};
  dicom_j2k.problem = DcmCodecList::canChangeCoding(EXS_JPEG2000LosslessOnly, EXS_LittleEndianExplicit)
                          ? "DCMTK has a JPEG 2000 decoder, but tessera refuses JPEG 2000 frames (never checked)"
                          : "Debian's DCMTK has no JPEG 2000 decoder: such series are refused (exit 5), naming the "
                            "file; convert them, or read the slide in another format";
  checks.push_back(dicom_j2k);
  checks.push_back(run_check({"JPEG 2000 in SVS (Aperio 33003/33005)", std::string("OpenSlide ") + openslide_get_version(),
                              "a lossless JPEG 2000 tile (libvips' OpenJPEG) in an Aperio SVS read back through "
                              "OpenSlide, every pixel compared"},
                             [&] { check_jpeg2000_svs(scratch); }));
  checks.push_back(run_check({"other images (PNG, JPEG, TIFF in strips)", std::string("libvips ") + vips_version_string(),
                              "a 24x16 PNG written and read back, every pixel compared"},
                             [&] {
                               const int width = 24, height = 16;
                               std::vector<uint8_t> written(width * height * 3);
                               for (size_t i = 0; i < written.size(); ++i)
                                 written[i] = static_cast<uint8_t>(i * 7 % 251);
                               const std::string path = (scratch / "image.png").string();
                               write_png_rgb(path, width, height, written.data());
                               auto slide = open_slide(path, kCacheBytes);
                               require(slide->format().rfind("vips:", 0) == 0, "read as " + slide->format());
                               require(read_level0(*slide, width, height) == written,
                                       "its pixels read back differ from those written");
                             }));
  return checks;
}

}  // namespace tessera::data
