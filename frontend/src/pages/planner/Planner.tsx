import { useQuery } from "@tanstack/react-query";
import { useEffect, useMemo, useRef, useState } from "react";
import { parseTokens } from "../../lib/format";
import { ApiError, client, unwrap, type Estimate, type FieldError, type Plan, type PlanDefaults, type Sweep } from "../../lib/api";
import { ExportButtons, SubmitRun } from "./Actions";
import { ProbePanel } from "./Probe";
import { FixPanel, RecommendPanel, SpMethodsPanel } from "./Advice";
import { buildPlan, decodePlanParam, fmtSeqInput, LOAD_KEY, planToForm, type Loaded, type PlanForm } from "./form";
import { ImportSetup } from "./ImportSetup";
import { LoadPlan } from "./LoadPlan";
import { FORM_FIELDS, PlannerForm } from "./PlannerForm";
import { BreakdownBar, CostCard, ThroughputFigures, Warnings } from "./Results";
import { SweepView } from "./Sweep";

/** Run `fn` `ms` after the last change of `key`, aborting the previous call. `fn` reports its own errors (the
 * latest `fn` runs: it reads the form as it is when the pause ends). */
function useDebounced(key: string, ms: number, fn: (signal: AbortSignal) => Promise<void>) {
  const latest = useRef(fn);
  useEffect(() => {
    latest.current = fn;
  });
  useEffect(() => {
    const ctl = new AbortController();
    const t = window.setTimeout(() => void latest.current(ctl.signal), ms);
    return () => {
      window.clearTimeout(t);
      ctl.abort();
    };
  }, [key, ms]);
}

/** A plan handed over by a run page's "Open in planner" (read once), or given in the link (?plan=). */
function handedOver(query?: URLSearchParams): unknown {
  const raw = sessionStorage.getItem(LOAD_KEY);
  sessionStorage.removeItem(LOAD_KEY);
  try {
    if (raw) return JSON.parse(raw);
    const param = query?.get("plan");
    return param ? decodePlanParam(param) : null;
  } catch {
    return null;
  }
}

function initialPlan(d: PlanDefaults, given: unknown): Loaded {
  try {
    if (given) return planToForm(given, d);
  } catch {
    // a broken link or hand-over: start from the example
  }
  return planToForm(d.plan, d);
}

/** The planner page: waits for the plan model's defaults from the API, then shows the form. */
export function Planner({ query }: { query?: URLSearchParams }) {
  const [given] = useState(() => handedOver(query));
  const { data: defaults, error } = useQuery({
    queryKey: ["plan-defaults"],
    queryFn: () => unwrap(client.GET("/api/plans/defaults")),
    staleTime: Infinity,
  });
  if (error) return <div className="card error" data-testid="planner-load-error">Could not load the planner: {error.message}</div>;
  if (!defaults) return <div className="muted" data-testid="planner-loading">Loading the planner…</div>;
  return <PlannerPage defaults={defaults} initial={initialPlan(defaults, given)} />;
}

function PlannerPage({ defaults, initial }: { defaults: PlanDefaults; initial: Loaded }) {
  const [form, setForm] = useState<PlanForm>(initial.form);
  const [run, setRun] = useState<{ key: number; run: Loaded["run"] }>({ key: 0, run: initial.run });
  const onLoad = (l: Loaded) => {
    setForm(l.form);
    if (l.run) setRun((r) => ({ key: r.key + 1, run: l.run }));
  };
  const [est, setEst] = useState<Estimate | null>(null);
  const [estError, setEstError] = useState("");
  const [sweep, setSweep] = useState<Sweep | null>(null);
  const [sweepError, setSweepError] = useState("");
  // the plan whose estimate (or error) is shown: until the current one's answer, the results are pending
  const [settled, setSettled] = useState<string | null>(null);

  const catalogQuery = useQuery({ queryKey: ["catalog"], queryFn: () => unwrap(client.GET("/api/catalog")), staleTime: Infinity });
  const catalog = catalogQuery.data ?? null;

  const built = useMemo(() => buildPlan(form), [form]);
  // the token budget of the run-cost card: part of the estimate's request (?train_tokens=), not of the plan
  const [budget, setBudget] = useState("");
  const trainTokens = parseTokens(budget);
  const planKey = JSON.stringify(built.plan);
  const estimateKey = `${planKey}|${Number.isFinite(trainTokens) ? trainTokens : ""}`;

  const pending = settled !== estimateKey;
  useDebounced(estimateKey, 250, async (signal) => {
    if (!built.plan) {
      setSettled(estimateKey);
      return;
    }
    try {
      const query = Number.isFinite(trainTokens) && trainTokens > 0 ? { train_tokens: trainTokens } : {};
      const e = await unwrap(client.POST("/api/estimate", { body: built.plan, params: { query }, signal }));
      setEst(e);
      setEstError("");
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof ApiError && err.status === 422 && err.fields.length) {
        // types the schema rejects (e.g. sp_size 0) come as a 422: show them beside the fields too
        setEst({ valid: false, errors: err.fields, warnings: [], memory: null, throughput: null });
        setEstError("");
      } else {
        setEstError((err as Error).message);
      }
    }
    if (!signal.aborted) setSettled(estimateKey);
  });

  // The sweep only depends on what the sp/seq_len sweep does not vary.
  const sweepKey = built.plan && est?.valid
    ? JSON.stringify({ ...built.plan, parallel: { ...built.plan.parallel, sp_size: null }, training: { ...built.plan.training, seq_len: null } })
    : "";
  useDebounced(sweepKey, 600, async (signal) => {
    if (!built.plan || !sweepKey) return;
    try {
      setSweep(await unwrap(client.POST("/api/estimate/sweep", { body: { plan: built.plan }, signal })));
      setSweepError("");
    } catch (err) {
      if (signal.aborted) return;
      setSweep(null);
      setSweepError((err as Error).message);
    }
  });

  const errors: FieldError[] = [...built.localErrors, ...(built.plan && est && !est.valid && !pending ? est.errors : [])];
  const unplaced = errors.filter((e) => !FORM_FIELDS.some((f) => e.field === f || e.field.startsWith(f + ".")));
  const valid = Boolean(built.plan && est?.valid && !pending);
  const showEst = est && est.valid && built.plan ? est : null;
  // "use this" / "apply": the plan goes into the form (the run section the form holds stays)
  const usePlan = (p: Plan) => onLoad({ ...planToForm(p, defaults), run: null });
  // the fix panel aims for the verdict "fits": it shows whenever the range's high end does not fit
  const overflows = Boolean(showEst?.memory && (showEst.memory.verdict !== "fits" || !showEst.memory.cpu_fits) && !pending);

  return (
    <div className="planner">
      <div className="planner-left">
        <ImportSetup onLoad={onLoad} defaults={defaults} />
        <LoadPlan plan={built.plan} onLoad={onLoad} defaults={defaults} />
        <PlannerForm form={form} setForm={setForm} catalog={catalog} errors={errors} choices={defaults.choices}
          warnings={(showEst?.warnings ?? []).filter((w): w is FieldError => typeof w !== "string")} />
      </div>
      <div className="planner-right" data-testid="planner-results" data-state={pending ? "pending" : valid ? "valid" : "invalid"}>
        {catalogQuery.error ? <div className="card error" data-testid="catalog-error">Could not load the catalog: {catalogQuery.error.message}</div> : null}
        {estError ? <div className="card error" data-testid="estimate-error">Estimate failed: {estError}</div> : null}
        {unplaced.length ? (
          <div className="card error" data-testid="plan-errors">
            {unplaced.map((e, i) => <div key={i}><b>{e.field || "plan"}</b>: {e.message}</div>)}
          </div>
        ) : null}
        {errors.length && !unplaced.length ? <div className="card error" data-testid="plan-invalid">The plan is not valid: see the fields marked in red.</div> : null}
        {showEst ? (
          <div className={pending ? "stale" : ""}>
            <Warnings est={showEst} placed={(f) => FORM_FIELDS.some((x) => f === x || f.startsWith(x + "."))} />
            <BreakdownBar est={showEst} />
            {overflows && built.plan ? <FixPanel plan={built.plan} planKey={planKey} onApply={usePlan} /> : null}
            <ThroughputFigures est={showEst} />
          </div>
        ) : null}
        <CostCard est={showEst} budget={budget} setBudget={setBudget} />
        <RecommendPanel plan={built.plan} globalBatch={showEst?.throughput?.sequences_per_step ?? null} defaults={defaults.defaults} onUse={usePlan} />
        <SpMethodsPanel plan={valid ? built.plan : null} />
        {/* the last sweep stays while a new estimate is pending, never beside a plan with errors */}
        {sweepError && !errors.length ? <div className="card error" data-testid="sweep-error">Sweep failed: {sweepError}</div> : null}
        {sweep && !errors.length ? (
          <SweepView sweep={sweep} currentSp={built.plan?.parallel?.sp_size ?? 0}
            onPick={(sp, dp, seq) => {
              // the row is a layout of the user's GPUs: sp and dp change, the hardware (Nodes, GPUs / node) never
              setForm({ ...form, sp_size: String(sp), dp_size: String(dp), seq_len: fmtSeqInput(seq), autoDp: true });
            }} />
        ) : null}
        <ExportButtons plan={valid ? built.plan : null} defaults={defaults.defaults.run} />
        <ProbePanel plan={valid ? built.plan : null} valid={valid} />
        <SubmitRun key={run.key} plan={built.plan} valid={valid} initial={run.run} defaults={defaults.defaults.run}
          schedulers={(defaults.choices["run.lr_scheduler"] ?? []).map(String)}
          trackers={(defaults.choices["run.report_to"] ?? []).map(String)} />
      </div>
    </div>
  );
}
