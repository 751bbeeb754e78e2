// tessera sweep: isolated hyperparameter search over any train flag (sweep/README.md).
#include <cstdio>
#include <filesystem>
#include <memory>

#include "common/error.h"
#include "common/output.h"
#include "sweep/report.h"
#include "sweep/sweep.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

namespace tessera::cli {

namespace {

struct SweepFlags {
  std::string study, sampler = "tpe", pruner = "none", direction, objective = "val_loss", isolation = "process";
  std::string export_format, output;
  std::vector<std::string> params, train_flags, allow_env;
  std::vector<int> devices;
  int trials = 0, parallel = 1;
  int64_t min_batch = 1;
  uint64_t seed = 0;
  double trial_timeout = 0, timeout_grace = 10, heartbeat_grace = 60;
  bool oom_retry = false, resume = false, show = false, overwrite = false;
};

// Stdout, or --output under the writer discipline (common/output.h): locked, never written
// through a link, an existing file replaced only with --overwrite.
void write_output(const std::string& text, const std::string& path, bool overwrite) {
  if (path.empty()) {
    std::fputs(text.c_str(), stdout);
    return;
  }
  write_output_file(path, text, "--output", overwrite);
}

void show_or_export(const SweepFlags& f) {
  sweep::StudyStore store(f.study, sweep::StudyStore::Mode::read_only);
  auto config = store.study();
  auto trials = store.trials();
  if (f.show) write_output(sweep::format_table(trials, config), f.export_format.empty() ? f.output : "", f.overwrite);
  if (f.export_format == "csv") write_output(sweep::export_csv(trials, config), f.output, f.overwrite);
  else if (f.export_format == "json") write_output(sweep::export_json(trials, config), f.output, f.overwrite);
  else if (f.export_format == "svg") write_output(sweep::export_svg(trials, config), f.output, f.overwrite);
  else if (f.export_format == "html") write_output(sweep::export_html(trials, config, store.name()), f.output, f.overwrite);
}

// train's flags as `tessera train` defines them: its CLI11 app, built here and read.
sweep::TrainFlags train_flags() {
  CLI::App app;
  add_train_command(app);
  sweep::TrainFlags known;
  std::function<void(const CLI::App&)> read = [&](const CLI::App& command) {
    for (const auto* option : command.get_options()) {
      std::vector<std::string> names;
      for (auto& name : option->get_lnames()) names.push_back("--" + name);
      for (auto& name : option->get_snames()) names.push_back("-" + name);
      for (auto& name : names) {
        known.names.insert(name);
        if (!option->get_default_str().empty()) known.defaults[name] = option->get_default_str();
      }
    }
    for (const auto* group : command.get_subcommands({}))
      if (group->get_name().empty()) read(*group);  // option groups
  };
  read(*app.get_subcommand("train"));
  return known;
}

void run(const SweepFlags& f, bool settings_given) {
  if (f.show || !f.export_format.empty()) return show_or_export(f);
  sweep::SweepOptions options;
  options.study = f.study;
  options.resume = f.resume;
  options.settings_given = settings_given;
  if (settings_given && f.trials < 1) throw UsageError("--trials: how many trials to run (at least 1)");
  if (settings_given && f.params.empty()) throw UsageError("--param: nothing to search (e.g. --param lr=loguniform:1e-4:1e-1)");
  options.config.objective = f.objective;
  if (!f.direction.empty()) options.config.direction = sweep::direction_from(f.direction);
  else if (auto direction = sweep::direction_of_metric(f.objective)) options.config.direction = *direction;
  else throw UsageError("--objective " + f.objective + ": say whether to --direction minimize or maximize it");
  options.config.sampler = f.sampler;
  options.config.pruner = f.pruner;
  options.config.seed = f.seed;
  options.config.target_trials = f.trials;
  options.config.space = sweep::parse_space(f.params);
  options.config.train_flags = f.train_flags;
  options.train = train_flags();
  options.heartbeat_grace = f.heartbeat_grace;
  options.parallel = f.parallel;
  options.devices = f.devices;
  options.trial_timeout = f.trial_timeout;
  options.timeout_grace = f.timeout_grace;
  options.oom_retry = f.oom_retry;
  options.min_batch = f.min_batch;
  options.allowed_environment.insert(f.allow_env.begin(), f.allow_env.end());
  options.tessera = {std::filesystem::read_symlink("/proc/self/exe").string()};
  if (f.isolation == "none") options.in_process = run_train_in_process;
  sweep::run_sweep(options);
}

}  // namespace

void add_sweep_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "sweep",
      "Hyperparameter search over any train flag, one child process and one fresh device per trial.\n"
      "  tessera sweep --study s.sqlite --trials 20 --param lr=loguniform:1e-4:1e-1 -- --data p.h5 --epochs 2\n"
      "  tessera sweep --study postgresql://host/db ...   (the same command on any number of machines)\n"
      "  tessera sweep --study s.sqlite --show | --export csv|json|svg|html [--output FILE]\n"
      "The same command on an existing study continues it; other settings are refused, naming each.");
  auto f = std::make_shared<SweepFlags>();
  command->add_option("--study", f->study,
                      "The study: a file (SQLite, one sweep at a time) or postgresql://USER@HOST/DB (shared by any "
                      "number of sweeps)")
      ->required();
  command->add_option("--trials", f->trials, "Trials in the study (an existing study grows to it)");
  auto* param = command->add_option("--param", f->params,
                                     "NAME=SPEC, NAME a train flag without dashes or env:VARIABLE; SPEC "
                                     "uniform:LOW:HIGH, loguniform:LOW:HIGH, int:LOW:HIGH, logint:LOW:HIGH, "
                                     "choice:A,B,...")
                    ->expected(1)
                    ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
                    ->allow_extra_args(false);  // one value per --param, so that it never eats the `--`
  auto* sampler = command->add_option("--sampler", f->sampler, "tpe, random or grid")->capture_default_str();
  auto* pruner = command->add_option("--pruner", f->pruner, "none, median or asha")->capture_default_str();
  auto* objective = command->add_option("--objective", f->objective,
                                        "The metric of train's final report to optimise: val_loss, val_accuracy, "
                                        "val_auc (two classes), train_loss, ...")
                        ->capture_default_str();
  auto* direction = command->add_option("--direction", f->direction,
                                        "minimize or maximize (default: from the objective: losses down, accuracy and "
                                        "AUC up)");
  auto* seed = command->add_option("--seed", f->seed, "Seed of the sampler")->capture_default_str();
  command->add_option("--parallel", f->parallel, "Trials at once")->capture_default_str();
  command->add_option("--devices", f->devices, "Device indices given to trials in turn, e.g. 0,1")
      ->delimiter(',')
      ->allow_extra_args(false);
  command->add_option("--trial-timeout", f->trial_timeout, "Seconds before a trial is stopped (0: never)")
      ->capture_default_str();
  command->add_option("--timeout-grace", f->timeout_grace, "Seconds between SIGTERM and SIGKILL")->capture_default_str();
  command->add_option("--heartbeat-grace", f->heartbeat_grace,
                      "Seconds without a heartbeat after which another worker reruns a running trial")
      ->capture_default_str()
      ->check(finite_positive());
  command->add_flag("--oom-retry", f->oom_retry, "Rerun an out-of-memory trial with half the --batch, twice --accumulate");
  command->add_option("--min-batch", f->min_batch, "Smallest micro-batch --oom-retry goes down to")->capture_default_str();
  command->add_option("--isolation", f->isolation, "process (a child per trial) or none (trials in this process)")
      ->check(CLI::IsMember({"process", "none"}))
      ->capture_default_str();
  command->add_flag("--resume", f->resume,
                    "Continue the study (which must exist): rerun interrupted trials, then run the rest; alone, "
                    "with the study's settings");
  command->add_option("--allow-env", f->allow_env,
                      "With --resume alone: a variable the study's env: parameters may set in trials (e.g. "
                      "TESSERA_FAULT); others are refused, since anyone who can write the study could set them")
      ->delimiter(',')
      ->allow_extra_args(false);
  auto* show = command->add_flag("--show", f->show, "Print the trials, the best parameters and checkpoint");
  auto* export_format =
      command->add_option("--export", f->export_format, "Write the study as csv, json, svg or html (one page to read)")
          ->check(CLI::IsMember({"csv", "json", "svg", "html"}));
  command->add_option("--output", f->output, "File for --show or --export (default: stdout)");
  command->add_flag("--overwrite", f->overwrite, "Replace an existing --output (otherwise refused)");
  command->add_option("train_flags", f->train_flags, "Fixed train flags, after --");
  show->excludes(param);
  export_format->excludes(param);
  // --resume alone takes the study's settings; with them, they are checked like any command's.
  command->callback([f, param, sampler, pruner, direction, objective, seed] {
    bool settings_given = !f->resume || param->count() > 0 || !f->train_flags.empty();
    if (!settings_given)
      for (auto* option : {sampler, pruner, direction, objective, seed})
        if (option->count() > 0)
          throw UsageError("--resume without --param takes the study's settings; give the whole command to check " +
                           option->get_name() + " against them");
    run(*f, settings_given);
  });
}

}  // namespace tessera::cli
