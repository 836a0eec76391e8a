#include "cli/cli_app.h"

#include <algorithm>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>

#include "cli/commands.h"

namespace strata::cli {
namespace {

// CLI11's help, with the hand-written synopsis first: it shows which options go together
// ("FILE.db | --server URL"), which a generated usage line cannot.
class HelpFormatter : public CLI::Formatter {
 public:
  explicit HelpFormatter(std::string usage) : usage_(std::move(usage)) {
    label("Positionals", "arguments");
    label("OPTIONS", "options");
    column_width(26);
  }
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    (void)name;
    return usage_ + "\n" + app->get_description() + make_positionals(app) + make_groups(app, mode) + "\n" +
           make_footer(app);
  }
  // CLI11 2.1 does not wrap option descriptions: lines of at most kDescWidth, so that with the
  // names' column the help fits 100 columns.
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string wrapped, line;
    std::istringstream words(CLI::Formatter::make_option_desc(opt));
    for (std::string w; words >> w;) {
      if (!line.empty() && line.size() + 1 + w.size() > kDescWidth) {
        wrapped += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + w;
    }
    return wrapped + line;
  }

 private:
  static constexpr size_t kDescWidth = 72;

  std::string usage_;
};

}  // namespace

void configure(CLI::App& app, std::string usage, std::string footer) {
  app.formatter(std::make_shared<HelpFormatter>(std::move(usage)));
  app.footer(std::move(footer));
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->group("options");
  app.set_help_flag("-h,--help", "print this help and exit");
}

std::optional<int> parse(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string why = e.what();
    std::replace(why.begin(), why.end(), '\n', ' ');  // one line, whatever CLI11 wrote
    // CLI11's wording for the two common slips, said plainly: "--listen: 1 required A missing",
    // "The following argument was not expected: --bogus".
    static const std::regex missing(R"(^(\S+): \d+ required (\S+) missing$)");
    static const std::regex extra(R"(^The following arguments? (was|were) not expected: (.*)$)");
    std::smatch m;
    if (std::regex_match(why, m, missing)) why = m[1].str() + " needs a value (" + m[2].str() + ")";
    else if (std::regex_match(why, m, extra)) why = "unknown option or extra argument: " + m[2].str();
    return fail(app.get_name() + ": " + why + " (see strata " + app.get_name() + " --help)", 1);
  }
  return std::nullopt;
}

}  // namespace strata::cli
