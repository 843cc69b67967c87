"""pflbench"""
