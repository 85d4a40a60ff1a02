#include "model/train/train_device.h"

#include <utility>

namespace dgca {
namespace {

// Host memory: the model's ParamStore is the state; nothing to pull or push.
class CpuTrainDevice : public TrainDevice {
 public:
  CpuTrainDevice(std::unique_ptr<DgcaModel> model, const AdamWOptions& aopt, int threads)
      : model_(std::move(model)), adam_(&model_->params(), aopt), threads_(threads) {}

  std::string Describe() const override {
    return "cpu (" + std::to_string(threads_) + (threads_ == 1 ? " thread)" : " threads)");
  }
  DgcaModel* model() override { return model_.get(); }
  ParamStore& params() override { return model_->params(); }
  AdamW& adam() override { return adam_; }
  bool device_memory() const override { return false; }
  float* grad_buffer() override { return params().grads(); }
  float* value_buffer() override { return params().values(); }
  float* moment1_buffer() override { return adam_.m().data(); }
  float* moment2_buffer() override { return adam_.v().data(); }
  Status BuffersChanged(int64_t optimizer_step) override {
    adam_.set_step(optimizer_step);
    return OkStatus();
  }
  Status ZeroGrads() override {
    params().ZeroGrads();
    return OkStatus();
  }
  StatusOr<double> ClipGradNorm(double max_norm) override {
    return dgca::ClipGradNorm(params().grads(), params().total_numel(), max_norm);
  }
  Status OptimizerStep(float lr) override {
    adam_.Step(lr);
    return OkStatus();
  }
  Status FinishStep() override { return OkStatus(); }
  Status PullToHost() override { return OkStatus(); }
  Status PushFromHost() override { return OkStatus(); }

 private:
  std::unique_ptr<DgcaModel> model_;
  AdamW adam_;
  int threads_;
};

}  // namespace

Status TrainDevice::AllReduceHost(Communicator* comm, float* host, size_t count, ReduceOp op) {
  if (device_memory() && comm->world_size() > 1) {
    return FailedPreconditionError(
        "AllReduceHost: this device's communicator works on device memory and the device does "
        "not stage host values through it");
  }
  return comm->AllReduce(host, count, op);
}

StatusOr<std::unique_ptr<TrainDevice>> MakeCpuTrainDevice(const TrainDeviceSpec& spec) {
  if (spec.precision != Precision::kFp32) {
    return UnimplementedError(
        "train: the CPU trainer runs fp32 only (precision fp16/bf16 needs device: cuda)");
  }
  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<DgcaModel> model,
                        DgcaModel::Create(spec.model, spec.micro_batch, spec.seq_len, spec.seed,
                                          spec.threads));
  return std::unique_ptr<TrainDevice>(new CpuTrainDevice(std::move(model), spec.adam, spec.threads));
}

}  // namespace dgca
