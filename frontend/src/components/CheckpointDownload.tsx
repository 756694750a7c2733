/** GET /api/runs/{id}/checkpoints/{name}: a streamed tar of one checkpoint directory, `name` being
 * `<stage>-checkpoint-<step>` (the `name` the checkpoints list gives each). */
export function checkpointUrl(runId: number, stage: string, step: number): string {
  return `/api/runs/${runId}/checkpoints/${encodeURIComponent(`${stage}-checkpoint-${step}`)}`;
}

/** The download link of one listed checkpoint; the browser names the file from the API's Content-Disposition. */
export function CheckpointDownload({ runId, stage, step }: { runId: number; stage: string; step: number }) {
  return (
    <a className="button" href={checkpointUrl(runId, stage, step)} download data-testid={`checkpoint-download-${stage}-${step}`}
      title="a tar of this checkpoint directory">
      Download
    </a>
  );
}
