#include "search_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "measurement.h"

namespace mha::tune {

namespace {

using json = nlohmann::ordered_json;

constexpr double kWidth = 840, kPanelHeight = 230, kLeft = 70, kRight = 20, kTop = 40, kBottom = 35;

struct Point {
    double ms;
    bool failed;
    bool kept;
    std::string role;
};

struct Panel {
    std::string bucket;
    std::string outcome;  // of the bucket's last decision
    json shape;
    std::vector<Point> points;
    std::vector<double> default_ms;
};

const char *role_color(const std::string &role) {
    if (role == "finalist")
        return "#e08000";
    if (role == "verify")
        return "#208020";
    return "#3060c0";  // search
}

// One panel per bucket, in the order the buckets were first measured; only measurements on the
// bucket's tuning shape (the first it was measured on), which share one time scale.
std::vector<Panel> panels(const std::vector<json> &records) {
    std::map<std::string, json> kept;
    std::map<std::string, std::string> outcome;
    for (const json &r : records) {
        if (r.at("kind") == "decision") {
            kept[r.at("bucket")] = r.at("params");
            outcome[r.at("bucket")] = r.value("kept_defaults", false)
                                          ? "defaults kept"
                                          : "tuned parameters kept (ringed)";
        }
    }
    std::vector<Panel> result;
    for (const json &r : records) {
        if (r.at("kind") != "measurement" || r.at("role") == "noise")
            continue;
        const std::string bucket = r.at("bucket");
        auto panel = std::find_if(result.begin(), result.end(),
                                  [&](const Panel &p) { return p.bucket == bucket; });
        if (panel == result.end())
            panel = result.insert(result.end(),
                                  Panel{bucket,
                                        outcome.count(bucket) ? outcome[bucket] : "undecided",
                                        r.at("shape"),
                                        {},
                                        {}});
        if (r.at("shape") != panel->shape)
            continue;
        const bool is_kept = kept.count(bucket) && kept[bucket] == r.at("params");
        if (r.contains("candidate_ms")) {
            panel->points.push_back({r.at("candidate_ms"), false, is_kept, r.at("role")});
            panel->default_ms.push_back(r.at("baseline_ms"));
        } else {
            panel->points.push_back({0, true, is_kept, r.at("role")});
        }
    }
    return result;
}

void draw_panel(std::string &svg, const Panel &p, double top) {
    const double plot_w = kWidth - kLeft - kRight, plot_h = kPanelHeight - kTop - kBottom;
    std::vector<double> times = p.default_ms;
    for (const Point &point : p.points)
        if (!point.failed)
            times.push_back(point.ms);
    if (times.empty())
        return;
    std::sort(times.begin(), times.end());
    const double defaults = p.default_ms.empty() ? 0 : median(p.default_ms);
    // The slowest candidates can be many times the defaults: cap the scale at 3x the median.
    const double lo = times.front() * 0.95;
    const double hi = std::min(times.back(), 3 * times[times.size() / 2]) * 1.05;
    const auto y = [&](double ms) {
        return top + kTop + plot_h * (1 - (std::min(ms, hi) - lo) / (hi - lo));
    };
    const auto x = [&](size_t i) {
        return kLeft + plot_w * (double(i) + 0.5) / double(std::max<size_t>(p.points.size(), 1));
    };
    svg += fmt::format(
        "<text x='{}' y='{}' font-size='13'>bucket {} — tuning shape {} (B, Sq, Sk, E, H): {} "
        "candidates; {}</text>\n",
        kLeft, top + 22, p.bucket, p.shape.dump(), p.points.size(), p.outcome);
    svg += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' fill='none' stroke='#888'/>\n",
                       kLeft, top + kTop, plot_w, plot_h);
    for (int tick = 0; tick <= 4; tick++) {
        const double ms = lo + (hi - lo) * tick / 4;
        svg += fmt::format(
            "<text x='{}' y='{:.1f}' font-size='10' text-anchor='end'>{:.3g} "
            "ms</text>\n",
            kLeft - 4, y(ms) + 3, ms);
    }
    svg += fmt::format(
        "<text x='{}' y='{}' font-size='10'>candidates in the order measured "
        "(blue: search, orange: finalists re-timed, green: verification)</text>\n",
        kLeft, top + kPanelHeight - 12);
    if (defaults > 0) {
        svg += fmt::format(
            "<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#c00000' "
            "stroke-dasharray='5,3'/>\n<text x='{}' y='{:.1f}' font-size='10' fill='#c00000' "
            "text-anchor='end'>defaults {:.3g} ms</text>\n",
            kLeft, kLeft + plot_w, y(defaults), y(defaults), kLeft + plot_w - 4, y(defaults) - 4,
            defaults);
    }
    for (size_t i = 0; i < p.points.size(); i++) {
        const Point &point = p.points[i];
        if (point.failed) {
            svg += fmt::format(
                "<text x='{:.1f}' y='{:.1f}' font-size='10' fill='#c00000' "
                "text-anchor='middle'>×</text>\n",
                x(i), top + kTop + 9);
            continue;
        }
        svg += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='2.5' fill='{}'/>\n", x(i),
                           y(point.ms), role_color(point.role));
        if (point.kept) {
            svg += fmt::format(
                "<circle cx='{:.1f}' cy='{:.1f}' r='6' fill='none' "
                "stroke='black'/>\n",
                x(i), y(point.ms));
        }
    }
}

}  // namespace

std::string search_plot_path(const std::string &tuned_file) {
    const std::string suffix = ".json";
    const bool json =
        tuned_file.size() > suffix.size() &&
        tuned_file.compare(tuned_file.size() - suffix.size(), suffix.size(), suffix) == 0;
    return (json ? tuned_file.substr(0, tuned_file.size() - suffix.size()) : tuned_file) +
           ".search.svg";
}

void write_search_plot(const TuningDb &db, const std::string &path) {
    const std::vector<Panel> all = panels(db.comparable_records());
    const RunContext &c = db.context();
    std::string svg;
    double top = 30;
    for (const Panel &p : all) {
        draw_panel(svg, p, top);
        top += kPanelHeight;
    }
    std::ofstream out(path);
    out << fmt::format(
               "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' "
               "font-family='sans-serif'>\n<rect width='100%' height='100%' "
               "fill='white'/>\n<text x='10' y='18' font-size='12'>mha-tune {}: {}, "
               "schedule code {}</text>\n",
               kWidth, top + 10, c.isa, c.machine, c.schedule_hash)
        << svg << "</svg>\n";
    if (!out)
        throw std::runtime_error("could not write the search plot " + path);
}

}  // namespace mha::tune
