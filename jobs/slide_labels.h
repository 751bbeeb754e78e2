// The labels file of a slide-level head (`train --features DIR --labels CSV`): which slides are
// in the study and the class of each, as tessera's own `slide,label` or CLAM's
// `case_id,slide_id,label` CSV.
#pragma once
#include <string>
#include <vector>

namespace tessera {

struct SlideLabel {
  std::string slide;     // the feature file's name without .h5
  std::string case_id;   // CLAM's case_id (the patient): its slides stay together in a fold; else the slide
  std::string label;     // as written ("1", "tumor_tissue")
  std::string path;      // DIR/<slide>.h5
  int row = 0;           // line of the file, from 1, for messages
};

// Reads `labels_path`: an optional header naming the columns (`slide,label`, or CLAM's
// `case_id,slide_id,label`; other columns are ignored), then one row a slide. Without a
// `case_id` column each slide is its own case. A UTF-8 byte
// order mark, CRLF line ends and double-quoted fields are read as a spreadsheet writes them.
// A slide id that CLAM wrote with its slide's extension (`s1.svs`) finds `s1.h5`.
// Throws BadInput (exit 5) naming the file and row for a malformed row, a slide listed twice
// (with the same or another label), or a slide id that is a path (`../x`, `/abs/x`, `a/b`): a
// labels file names feature files inside `features_dir`, never elsewhere.
std::vector<SlideLabel> read_slide_labels(const std::string& labels_path, const std::string& features_dir);

}  // namespace tessera
