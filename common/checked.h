// Checked arithmetic for every size, count, offset and coordinate that comes from a file, a
// description or a flag: an overflow, a negative value where a size is meant, or a value the type
// that holds it cannot take is an error naming the field and where it came from (BadInput, exit 5,
// for a file; UsageError, exit 2, for a flag), never a number that wrapped to zero or went negative.
#pragma once
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

namespace tessera {

// Where a number came from: a field of a file ("slide.ome.tiff", "OME-XML Pixels SizeC") or a
// flag ("--size"). Refusals read "slide.ome.tiff: OME-XML Pixels SizeC is ..." or "--size is ...".
class Field {
 public:
  Field(std::string source, std::string name) : source_(std::move(source)), name_(std::move(name)) {}
  static Field flag(std::string name) { return Field(std::move(name)); }

  bool is_flag() const { return flag_; }
  const std::string& name() const { return name_; }
  // The same source (file or flag), another field: a value derived from this one.
  Field renamed(std::string name) const {
    Field field = *this;
    field.name_ = std::move(name);
    return field;
  }
  // "slide.tiff: TileWidth", or "--size".
  std::string describe() const { return flag_ ? name_ : source_ + ": " + name_; }
  // Throws UsageError for a flag, else BadInput: the field, then `problem`.
  [[noreturn]] void refuse(const std::string& problem) const;

 private:
  explicit Field(std::string name) : name_(std::move(name)), flag_(true) {}
  std::string source_, name_;
  bool flag_ = false;
};

namespace checked_detail {
[[noreturn]] void refuse_range(const Field& field, const std::string& value, const std::string& low,
                               const std::string& high, const char* why);
[[noreturn]] void refuse_overflow(const Field& field, const std::string& a, char operation, const std::string& b,
                                  const std::string& low, const std::string& high);
[[noreturn]] void refuse_real(const Field& field, double value, const std::string& low, const std::string& high);
}  // namespace checked_detail

// `value` as a `To`: refused when it does not fit (a negative value into an unsigned type included).
template <std::integral To, std::integral From>
To narrow(From value, const Field& field) {
  if (!std::in_range<To>(value))
    checked_detail::refuse_range(field, std::to_string(value), std::to_string(std::numeric_limits<To>::min()),
                                 std::to_string(std::numeric_limits<To>::max()), nullptr);
  return static_cast<To>(value);
}

// `value` when low <= value <= high; else refused naming the range and, where given, why it holds.
template <std::integral T>
T within(T value, std::type_identity_t<T> low, std::type_identity_t<T> high, const Field& field,
         const char* why = nullptr) {
  if (value < low || value > high)
    checked_detail::refuse_range(field, std::to_string(value), std::to_string(low), std::to_string(high), why);
  return value;
}

// a * b and a + b, refused where they overflow T (or go below its minimum).
template <std::integral T>
T multiply(T a, std::type_identity_t<T> b, const Field& field) {
  T product{};
  if (__builtin_mul_overflow(a, b, &product))
    checked_detail::refuse_overflow(field, std::to_string(a), 'x', std::to_string(b),
                                    std::to_string(std::numeric_limits<T>::min()),
                                    std::to_string(std::numeric_limits<T>::max()));
  return product;
}

template <std::integral T>
T add(T a, std::type_identity_t<T> b, const Field& field) {
  T sum{};
  if (__builtin_add_overflow(a, b, &sum))
    checked_detail::refuse_overflow(field, std::to_string(a), '+', std::to_string(b),
                                    std::to_string(std::numeric_limits<T>::min()),
                                    std::to_string(std::numeric_limits<T>::max()));
  return sum;
}

// A real number rounded to the nearest `To`: refused when it is not finite or falls outside
// [low, high] (by default what `To` holds), so a size computed from a pixel size or a downsample
// never converts to a wrapped or undefined integer.
template <std::integral To>
To rounded(double value, const Field& field, To low = std::numeric_limits<To>::min(),
           To high = std::numeric_limits<To>::max()) {
  double nearest = std::round(value);
  if (!std::isfinite(value) || nearest < static_cast<double>(low) || nearest > static_cast<double>(high) ||
      nearest >= 9223372036854775808.0)
    checked_detail::refuse_real(field, value, std::to_string(low), std::to_string(high));
  return static_cast<To>(nearest);
}

}  // namespace tessera
