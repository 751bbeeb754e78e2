#include "data/library_messages.h"

#include <dcmtk/oflog/appender.h>
#include <dcmtk/oflog/oflog.h>
#include <dcmtk/oflog/spi/logevent.h>
#include <glib.h>
#include <hdf5.h>

#include <array>
#include <cstdarg>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string_view>

#include "common/hdf5_lock.h"
#include "common/library_warnings.h"

namespace tessera::data {

namespace {

thread_local std::string tiff_error;

std::string formatted(const char* module, const char* format, va_list args) {
  std::array<char, 512> text{};
  std::vsnprintf(text.data(), text.size(), format, args);
  return std::string(module && *module ? module : "libtiff") + ": " + text.data();
}

// A TIFF this process opened: errors kept for the exception that follows, warnings told once.
int keep_tiff_error(TIFF*, void*, const char* module, const char* format, va_list args) {
  tiff_error = formatted(module, format, args);
  return 1;
}

int tell_tiff_warning(TIFF* tiff, void*, const char* module, const char* format, va_list args) {
  library_warning("libtiff", tiff ? TIFFFileName(tiff) : library_file(), formatted(module, format, args));
  return 1;
}

// A TIFF another library opened (OpenSlide), or a call without one: the same, by the scope's file.
void keep_global_tiff_error(const char* module, const char* format, va_list args) {
  tiff_error = formatted(module, format, args);
}

void tell_global_tiff_warning(const char* module, const char* format, va_list args) {
  library_warning("libtiff", library_file(), formatted(module, format, args));
}

std::string field_text(const GLogField& field) {
  const auto* text = static_cast<const char*>(field.value);
  if (!text) return {};
  return field.length < 0 ? std::string(text) : std::string(text, static_cast<size_t>(field.length));
}

// GLib's log, where libvips (domain VIPS) and OpenSlide warn.
GLogWriterOutput glib_writer(GLogLevelFlags level, const GLogField* fields, gsize count, gpointer user_data) {
  // Debug and info messages show only when G_MESSAGES_DEBUG asks for them, as GLib does.
  if (level & (G_LOG_LEVEL_INFO | G_LOG_LEVEL_DEBUG)) return g_log_writer_default(level, fields, count, user_data);
  std::string domain, message;
  for (gsize i = 0; i < count; ++i) {
    std::string_view key = fields[i].key;
    if (key == "MESSAGE") message = field_text(fields[i]);
    if (key == "GLIB_DOMAIN") domain = field_text(fields[i]);
  }
  library_warning(domain == "VIPS" ? "libvips" : domain.empty() ? "GLib" : domain, library_file(), message);
  return G_LOG_WRITER_HANDLED;
}

// DCMTK's warnings; its errors come back as the failing call's status, which tessera turns into
// an error naming the file.
class DcmtkWarnings final : public dcmtk::log4cplus::Appender {
 public:
  ~DcmtkWarnings() override { destructorImpl(); }
  void close() override {}

 protected:
  void append(const dcmtk::log4cplus::spi::InternalLoggingEvent& event) override {
    if (event.getLogLevel() < dcmtk::log4cplus::ERROR_LOG_LEVEL)
      library_warning("DCMTK", library_file(), event.getMessage().c_str());
  }
};

std::unique_ptr<TIFFOpenOptions, void (*)(TIFFOpenOptions*)> tiff_options() {
  std::unique_ptr<TIFFOpenOptions, void (*)(TIFFOpenOptions*)> options(TIFFOpenOptionsAlloc(), TIFFOpenOptionsFree);
  TIFFOpenOptionsSetErrorHandlerExtR(options.get(), keep_tiff_error, nullptr);
  TIFFOpenOptionsSetWarningHandlerExtR(options.get(), tell_tiff_warning, nullptr);
  return options;
}

}  // namespace

void capture_library_messages() {
  static std::once_flag once;
  std::call_once(once, [] {
    TIFFSetErrorHandler(keep_global_tiff_error);
    TIFFSetWarningHandler(tell_global_tiff_warning);
    g_log_set_writer_func(glib_writer, nullptr, nullptr);
    // DCMTK configures its console logger on first use: after that, its root logger is ours.
    OFLog::getLogger("dcmtk");
    dcmtk::log4cplus::Logger root = dcmtk::log4cplus::Logger::getRoot();
    root.removeAllAppenders();
    root.addAppender(dcmtk::log4cplus::SharedAppenderPtr(new DcmtkWarnings));
    // Without thread safety HDF5's automatic error printing is one setting for the process; each
    // failing call becomes an error naming the file and dataset.
    const Hdf5Lock hdf5_lock;
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

TIFF* open_tiff(const std::string& path, const char* mode) {
  tiff_error.clear();
  return TIFFOpenExt(path.c_str(), mode, tiff_options().get());
}

TIFF* open_tiff_fd(int fd, const std::string& path, const char* mode) {
  tiff_error.clear();
  return TIFFFdOpenExt(fd, path.c_str(), mode, tiff_options().get());
}

const std::string& last_tiff_error() { return tiff_error; }

}  // namespace tessera::data
