import { useMutation } from "@tanstack/react-query";
import { useState } from "react";
import { client, unwrapRun, type Run } from "../../lib/api";

/** Tags (comma-separated) and notes a person keeps on a run; saved with PATCH /api/runs/{id}. */
export function Labels({ run, onChange }: { run: Run; onChange: (r: Run) => void }) {
  const [tags, setTags] = useState((run.tags ?? []).join(", "));
  const [notes, setNotes] = useState(run.notes ?? "");
  const save = useMutation({
    mutationFn: () => unwrapRun(client.PATCH("/api/runs/{run_id}", {
      params: { path: { run_id: run.id } },
      body: { tags: tags.split(",").map((t) => t.trim()).filter(Boolean), notes },
    })),
    onSuccess: onChange,
  });
  const msg = save.error ? save.error.message : save.isSuccess ? "saved" : "";
  return (
    <div className="card" data-testid="run-labels">
      <h3>Tags and notes</h3>
      <label className="field"><span className="field-label">tags (comma-separated)</span>
        <input data-testid="run-tags-input" value={tags} onChange={(e) => setTags(e.target.value)} placeholder="baseline, 64k" /></label>
      <label className="field"><span className="field-label">notes</span>
        <textarea data-testid="run-notes-input" value={notes} onChange={(e) => setNotes(e.target.value)} rows={3} /></label>
      <button type="button" data-testid="run-labels-save" disabled={save.isPending} onClick={() => save.mutate()}>Save</button>
      {msg ? <span className="muted small" data-testid="run-labels-status"> {msg}</span> : null}
    </div>
  );
}
