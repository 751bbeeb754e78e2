#include "compute/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/error.h"
#include "common/progress.h"
#include "compute/faults.h"
#include "compute/replica_group.h"
#include "compute/run_checks.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

void check_finite(double loss_sum, int epoch, size_t step) {
  if (!std::isfinite(loss_sum))
    throw Diverged("training diverged: the loss is not finite in epoch " + std::to_string(epoch + 1) + " by step " +
                   std::to_string(step) + " (try a lower --lr)");
}

}  // namespace

// The epoch loop over a group of replicas: steps, evaluation, reports and checkpoints.
struct TrainingLoop::State {
  State(const std::vector<vk::Context*>& devices, const LoopSettings& loop_settings, TrainingJob training_job)
      : settings(loop_settings), job(std::move(training_job)), group(devices, settings, job) {}

  void run(Feed& train_feed, Feed& validation_feed, const TrainReporting& reporting) {
    // Every device's plan is checked before any device allocates.
    auto device_plans = group.plans();
    for (size_t r = 0; r < device_plans.size(); ++r)
      check_plan_fits(group.replicas()[r]->context(), device_plans[r], job.advice);
    Faults faults = Faults::from_environment();
    for (auto& replica : group.replicas()) faults.before_training(replica->context());
    group.allocate();
    for (auto& replica : group.replicas()) {
      replica->initialise(job.start, job.start_path, faults.loss_scale);
      if (faults.nan_tensor) replica->inject_nan(*faults.nan_tensor);
      replica->record();
    }
    train(train_feed, validation_feed, reporting, faults);
  }

  void train(Feed& train_feed, Feed& validation_feed, const TrainReporting& reporting, const Faults& faults) {
    Processes& processes = group.processes();
    Replica& first = group.first();
    int first_epoch = 0;
    if (job.start && job.start->progress.is_object()) first_epoch = job.start->progress.value("epoch", 0);
    size_t steps = train_feed.batches_per_epoch() / static_cast<size_t>(settings.accumulate);
    uint64_t total_steps = steps * static_cast<uint64_t>(settings.epochs - first_epoch);
    group.check_processes_agree({static_cast<double>(steps), static_cast<double>(validation_feed.batches_per_epoch()),
                                 static_cast<double>(first_epoch), static_cast<double>(first.gradient_count())});
    // Every process loads whole batches (the loss weights need every label) but decodes only the
    // training samples of its own replicas, which are consecutive.
    if (processes.size() > 1) {
      const BatchPart& last = group.replicas().back()->part();
      train_feed.compute_only(first.part().first, last.first + last.count - first.part().first);
    }
    // Every process reads the metrics at the same steps (a collective); rank 0 reports them.
    bool lead = processes.rank() == 0;
    std::unique_ptr<Progress> progress;
    if (reporting.progress && lead) progress = std::make_unique<Progress>("train", total_steps);
    nlohmann::json last;
    double wait_seconds = 0, run_seconds = 0;
    uint64_t done = 0;
    for (int epoch = first_epoch; epoch < settings.epochs; ++epoch) {
      auto epoch_start = Clock::now();
      train_feed.start_epoch(static_cast<uint32_t>(epoch));
      group.reset_metrics();
      group.exchange_seconds = 0;
      group.exchange_bytes = 0;
      for (size_t step = 0; step < steps; ++step) {
        int slot = static_cast<int>(step % static_cast<size_t>(group.staging_slots()));
        for (int k = 0; k < settings.accumulate; ++k) {
          for (auto& replica : group.replicas()) replica->micro_batch(slot, k).programs.back()->wait();
          auto before = Clock::now();
          if (!train_feed.next(group.feed_target(slot, k)))
            throw std::logic_error("the feed ended before its batches_per_epoch");
          wait_seconds += std::chrono::duration<double>(Clock::now() - before).count();
          group.distribute(slot, k, true);
          group.run_micro_batch(slot, static_cast<size_t>(k));
        }
        if (group.replicated()) group.exchange_gradients(slot);
        ++done;
        if (reporting.progress && (step + 1) % 20 == 0) {
          auto m = group.read_metrics();
          check_finite(m[0], epoch, step);
          if (progress) progress->update(done, {{"epoch", epoch + 1}, {"loss", m[0] / std::max(1.0, m[2])}});
        }
      }
      auto train_metrics = group.read_metrics();
      check_finite(train_metrics[0], epoch, steps);
      if (progress) progress->update(done);
      double train_seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
      run_seconds += train_seconds;
      auto val_metrics = evaluate(validation_feed, epoch);
      double samples = std::max(1.0, train_metrics[2]), val_samples = std::max(1.0, val_metrics[2]);
      last = {{"event", "epoch"},
              {"epoch", epoch + 1},
              {"epochs", settings.epochs},
              {"train_loss", train_metrics[0] / samples},
              {"train_accuracy", train_metrics[1] / samples},
              {"val_loss", val_metrics[2] > 0 ? nlohmann::json(val_metrics[0] / val_samples) : nlohmann::json()},
              {"val_accuracy", val_metrics[2] > 0 ? nlohmann::json(val_metrics[1] / val_samples) : nlohmann::json()},
              {"train_samples", std::llround(train_metrics[2])},
              {"val_samples", std::llround(val_metrics[2])},
              {"images_per_second", train_metrics[2] / train_seconds},
              {"data_wait_fraction", run_seconds > 0 ? wait_seconds / run_seconds : 0.0},
              {"peak_device_bytes", group.peak_device_bytes()}};
      if (auto auc = val_scores.auc()) last["val_auc"] = *auc;
      if (auto scaling = first.loss_scale_state()) {
        last["loss_scale"] = scaling->scale;
        last["skipped_steps"] = scaling->skipped_steps;
      }
      auto params = download_tensors(first.checkpoint_tensors());
      if (group.replicated()) {
        last["replicas"] = group.replicas_in_job();
        last["replica_weight_difference"] = group.replica_weight_difference(params);
        // The host's gradient sum (over this process's replicas, then MPI), per replica's bytes.
        last["allreduce_bytes_per_second"] =
            group.exchange_seconds > 0 ? static_cast<double>(group.exchange_bytes) / group.exchange_seconds : 0.0;
      }
      last.update(job.report);
      if (progress) progress->event(last);
      if (reporting.protocol && lead) {
        double value = val_metrics[2] > 0 ? val_metrics[0] / val_samples : train_metrics[0] / samples;
        reporting.protocol({{"type", "intermediate"}, {"step", epoch + 1}, {"value", value}, {"metrics", last}});
      }
      check_finite_state(params, download_tensors(first.train_tensors()), epoch + 1);
      if (!settings.checkpoint.empty() && lead) save(epoch + 1, last);
      faults.after_epoch(epoch + 1, processes.rank());
    }
    if (progress) progress->finish();
    uint64_t peak = group.peak_device_bytes();  // a collective: every process, protocol or not
    if (reporting.protocol && lead && last.is_object()) {
      double value = last["val_loss"].is_number() ? last["val_loss"].get<double>() : last.value("train_loss", 0.0);
      reporting.protocol({{"type", "final"},
                          {"value", value},
                          {"metrics", last},
                          {"peak_device_bytes", peak},
                          {"device", first.context().info().name}});
    }
  }

  std::array<double, 3> evaluate(Feed& feed, int epoch) {
    if (group.replicated()) {
      group.wait_all();
      group.broadcast_state();
    }
    group.reset_metrics();
    val_scores.clear();
    feed.start_epoch(static_cast<uint32_t>(epoch));
    bool binary = group.first().classes() == 2;
    for (size_t b = 0;; ++b) {
      int slot = static_cast<int>(b % static_cast<size_t>(group.staging_slots()));
      for (auto& replica : group.replicas()) replica->eval_program(slot).wait();
      if (!feed.next(group.feed_target(slot, 0))) break;
      group.distribute(slot, 0, false);
      for (auto& replica : group.replicas()) replica->eval_program(slot).submit();
      if (binary)
        for (auto& replica : group.replicas()) replica->score(slot, val_scores);
    }
    if (binary && group.processes().size() > 1) val_scores = group.gather_scores(val_scores);
    return group.read_metrics();
  }

  void save(int epochs_done, const nlohmann::json& metrics) {
    group.wait_all();
    Checkpoint checkpoint;
    checkpoint.model = job.model;
    checkpoint.params = download_tensors(group.first().checkpoint_tensors());
    checkpoint.train = download_tensors(group.first().train_tensors());
    checkpoint.progress = job.settings;
    checkpoint.progress.update({{"epoch", epochs_done}, {"metrics", metrics}});
    write_checkpoint(settings.checkpoint, checkpoint);
  }

  const LoopSettings settings;
  TrainingJob job;
  ReplicaGroup group;
  BinaryScores val_scores;
};

TrainingLoop::TrainingLoop(vk::Context& context, const LoopSettings& settings, TrainingJob job)
    : TrainingLoop(std::vector<vk::Context*>{&context}, settings, std::move(job)) {}

TrainingLoop::TrainingLoop(const std::vector<vk::Context*>& devices, const LoopSettings& settings, TrainingJob job)
    : state_(std::make_unique<State>(devices, settings, std::move(job))) {}

int64_t TrainingLoop::classes() const { return state_->group.first().classes(); }

TrainingLoop::~TrainingLoop() {
  if (state_) state_->group.wait_all();
}

std::vector<MemoryPlan> TrainingLoop::plans() const { return state_->group.plans(); }

std::map<std::string, HostArray> TrainingLoop::parameters() const {
  state_->group.wait_all();
  return download_tensors(state_->group.first().checkpoint_tensors());
}

void TrainingLoop::run(Feed& train, Feed& validation, const TrainReporting& reporting) {
  state_->run(train, validation, reporting);
}

}  // namespace tessera
