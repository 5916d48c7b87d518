"""train.profile: a torch.profiler trace of chosen steps, one file per rank and window, for TensorBoard's
profiler plugin or Perfetto (ui.perfetto.dev) / chrome://tracing."""
import os

# torch.profiler.schedule's arguments (counted in this run's steps) and profile's recording switches.
SCHEDULE_KEYS = ("wait", "warmup", "active", "repeat", "skip_first")


class StepProfiler:
    """Call step() after every optimizer step and close() at the end. Window k covers the steps
    skip_first + k * (wait + warmup + active) + wait + warmup + 1 .. + active of this run; its trace is
    {logging_dir}/profile/rank{R}_steps{first}-{last}.pt.trace.json (steps numbered as the trainer's)."""

    def __init__(self, options, log_dir, rank, device, start_step):
        from torch.profiler import ProfilerActivity, profile, schedule
        self.folder, self.rank, self.start_step = os.path.join(log_dir, "profile"), rank, start_step
        self.options, self.paths = options, []
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.profiler = profile(
            activities=activities, schedule=schedule(**{k: options[k] for k in SCHEDULE_KEYS}),
            on_trace_ready=self._write, record_shapes=options["record_shapes"],
            profile_memory=options["profile_memory"], with_stack=options["with_stack"], with_flops=options["with_flops"])
        self.profiler.start()

    def _write(self, profiler):
        # called when the window's last step is done (or at close(), in a window cut short by the end of the
        # run): profiler.step_num counts this run's steps done; the window began `into` steps before the last
        o = self.options
        done = profiler.step_num
        into = (done - 1 - o["skip_first"]) % (o["wait"] + o["warmup"] + o["active"]) - o["wait"] - o["warmup"]
        if into < 0:
            return  # the run ended before the window's first step
        last = self.start_step + done
        first = last - into
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"rank{self.rank}_steps{first}-{last}.pt.trace.json")
        profiler.export_chrome_trace(path)
        self.paths.append(path)

    def step(self):
        self.profiler.step()

    def close(self):
        self.profiler.stop()  # a window cut short by the end of the run is written too
