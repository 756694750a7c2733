import type { RunState } from "./api";

// What the dashboard knows of each run state (the type is generated: backend/runs/states.py RunState). A Record over
// RunState: a state added to the API's enum does not compile until it is described here.
const STATES: Record<RunState, { terminal: boolean; failure: boolean }> = {
  pending_approval: { terminal: false, failure: false },
  queued: { terminal: false, failure: false },
  starting: { terminal: false, failure: false },
  running: { terminal: false, failure: false },
  succeeded: { terminal: true, failure: false },
  failed: { terminal: true, failure: true },
  oom: { terminal: true, failure: true },
  cancelled: { terminal: true, failure: false },
  lost: { terminal: true, failure: true },
  stopped: { terminal: true, failure: false },
};

/** Every run state, in the order of a run's life (the runs page's filter and its sort by state). */
export const RUN_STATES = Object.keys(STATES) as RunState[];

/** The run has ended: nothing will change it but a retry. */
export const isTerminal = (s: RunState): boolean => STATES[s].terminal;
/** The run ended without succeeding: a retry (or "resume from here") may pick it up. */
export const isUnfinished = (s: RunState): boolean => STATES[s].terminal && s !== "succeeded";
/** The run broke (the run page shows its error panel): failed, out of memory, or its worker lost. */
export const isFailure = (s: RunState): boolean => STATES[s].failure;
