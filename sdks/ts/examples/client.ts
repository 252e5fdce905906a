// Submits a greeting task to the "default" pool and prints its output once a worker ran it.
import { CronoqError, connect } from "@synaptiai/cronoq";

const client = connect(process.env.CRONOQ_TARGET ?? "http://127.0.0.1:7070", {
  token: process.env.CRONOQ_TOKEN,
});
try {
  // The key makes the submission idempotent: a second run finds the same task.
  const { id, duplicate } = await client.submit({
    pool: "default",
    key: "greet-ada",
    payload: { name: "Ada" },
    priority: "high",
  });
  console.log(`task ${id}${duplicate ? " (submitted before)" : ""}`);
  const result = await client.wait(id, { timeout: 30 });
  if (result.status !== "succeeded") throw new Error(`task ${id} ${result.status}: ${result.message}`);
  console.log(result.output?.toString());
} catch (err) {
  // A wait that timed out leaves the task running: waiting again later is the remedy.
  if (!(err instanceof CronoqError && err.timeout)) throw err;
  console.error(err.message);
  process.exitCode = 1;
} finally {
  client.close();
}
