#include "common/checked.h"

#include <sstream>

#include "common/error.h"

namespace tessera {

void Field::refuse(const std::string& problem) const {
  if (flag_) throw UsageError(describe() + " " + problem);
  throw BadInput(describe() + " " + problem);
}

namespace checked_detail {

void refuse_range(const Field& field, const std::string& value, const std::string& low, const std::string& high,
                  const char* why) {
  field.refuse("is " + value + ", not from " + low + " to " + high + (why ? std::string(" (") + why + ")" : ""));
}

void refuse_overflow(const Field& field, const std::string& a, char operation, const std::string& b,
                     const std::string& low, const std::string& high) {
  field.refuse("overflows: " + a + " " + operation + " " + b + " lies outside " + low + " to " + high);
}

void refuse_real(const Field& field, double value, const std::string& low, const std::string& high) {
  std::ostringstream text;
  text << value;
  field.refuse("is " + text.str() + ", not a number from " + low + " to " + high);
}

}  // namespace checked_detail

}  // namespace tessera
