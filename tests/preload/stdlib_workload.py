"""A stdlib-heavy workload for the preload tests: many small and large allocations through
CPython's allocators. Deterministic: prints the same lines on every run, and checks itself."""
import base64, bisect, collections, csv, datetime, decimal, difflib, fractions, hashlib, heapq
import io, itertools, json, pickle, random, re, sqlite3, statistics, struct, subprocess, sys
import textwrap, unicodedata, zlib

rng = random.Random(7)
out = []

# Containers and strings: dicts, lists, sets of many small objects.
words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 12))) for _ in range(60000)]
counts = collections.Counter(words)
out.append(("counter", len(counts), counts.most_common(1)[0][1]))
index = collections.defaultdict(list)
for i, w in enumerate(words):
    index[w[:2]].append(i)
out.append(("index", len(index), sum(len(v) for v in index.values())))
assert sum(len(v) for v in index.values()) == len(words)

# JSON and pickle round trips of a large nested structure.
doc = {str(i): {"w": words[i], "n": [i, i * i, i % 7], "f": i / 3} for i in range(40000)}
text = json.dumps(doc, sort_keys=True)
assert json.loads(text) == doc
assert pickle.loads(pickle.dumps(doc, protocol=5)) == doc
out.append(("json", len(text), hashlib.sha256(text.encode()).hexdigest()[:16]))

# Compression, hashing, base64 of multi-MiB buffers.
blob = text.encode() * 3
z = zlib.compress(blob, 6)
assert zlib.decompress(z) == blob
out.append(("zlib", len(blob), len(z), hashlib.md5(z).hexdigest()[:12]))
b64 = base64.b64encode(blob)
assert base64.b64decode(b64) == blob

# Regular expressions, csv, textwrap, difflib, unicodedata.
pairs = re.findall(r'"(\d+)": \{"f": ([0-9.]+)', text)
out.append(("re", len(pairs), pairs[12345][0]))
buf = io.StringIO()
w = csv.writer(buf)
for i in range(20000):
    w.writerow([i, words[i], i * 0.5])
rows = list(csv.reader(io.StringIO(buf.getvalue())))
assert len(rows) == 20000 and rows[777][1] == words[777]
wrapped = textwrap.fill(" ".join(words[:5000]), width=71)
out.append(("textwrap", wrapped.count("\n")))
diff = list(difflib.unified_diff(words[:3000], words[1:3001], lineterm=""))
out.append(("difflib", len(diff)))
names = [unicodedata.name(chr(c), "?") for c in range(0x100, 0x3000)]
out.append(("unicodedata", sum(len(n) for n in names)))

# Numbers: decimal, fractions, statistics, heapq, bisect, struct.
decimal.getcontext().prec = 60
d = sum(decimal.Decimal(1) / decimal.Decimal(i) for i in range(1, 3000))
f = sum(fractions.Fraction(1, i) for i in range(1, 300))
out.append(("decimal", str(d)[:30], f.numerator % 1000003))
nums = [rng.random() for _ in range(100000)]
out.append(("statistics", round(statistics.mean(nums), 6), round(statistics.median(nums), 6)))
heap = list(nums)
heapq.heapify(heap)
smallest = [heapq.heappop(heap) for _ in range(100)]
assert smallest == sorted(nums)[:100]
srt = sorted(nums)
assert bisect.bisect_left(srt, srt[5000]) == 5000
packed = struct.pack("<%dd" % len(nums), *nums)
assert list(struct.unpack("<%dd" % len(nums), packed)) == nums
days = [datetime.date(2000, 1, 1) + datetime.timedelta(days=i) for i in range(10000)]
out.append(("datetime", days[-1].isoformat()))
out.append(("itertools", sum(1 for _ in itertools.combinations(range(40), 3))))

# sqlite3 module in memory, and a child process (the shim is inherited).
con = sqlite3.connect(":memory:")
con.execute("create table t(k integer primary key, w text)")
con.executemany("insert into t(w) values (?)", ((x,) for x in words))
out.append(("sqlite3", con.execute("select count(distinct w), max(length(w)) from t").fetchone()))
child = subprocess.run([sys.executable, "-c", "import json; print(len(json.dumps(list(range(100000)))))"],
                       capture_output=True, text=True, check=True)
out.append(("subprocess", child.stdout.strip()))

for line in out:
    print(*line)
