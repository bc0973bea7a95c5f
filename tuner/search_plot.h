// A picture of a tuning search (SVG, written beside the tuning database): per bucket, each
// candidate's time on the bucket's tuning shape in the order measured, the defaults' time as a
// line, the kept parameters ringed, failed candidates marked.
#pragma once

#include <string>

#include "tuning_db.h"

namespace mha::tune {

// Where the plot of the search behind a tuned file goes: <isa>.<cpu>.json ->
// <isa>.<cpu>.search.svg.
std::string search_plot_path(const std::string &tuned_file);

// Plots the database's records that this run could reuse (same instruction set, target,
// schedule code and machine).
void write_search_plot(const TuningDb &db, const std::string &path);

}  // namespace mha::tune
